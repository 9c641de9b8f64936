"""The daemon's imperative shell around the core: controllers, persistence, signals."""

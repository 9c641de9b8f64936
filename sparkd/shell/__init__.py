"""The imperative shell: everything that talks to hosts (SSH, HTTP) lives here."""

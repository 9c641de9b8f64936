"""Controller HA on etcd, opt-in through the `[ha]` config section.

Only `config` is imported without `[ha]`: it holds the section's schema and nothing that talks
to etcd. The client (`etcd`) and the ownership rules (`ownership`) are imported by the daemon
only when the section is set.
"""

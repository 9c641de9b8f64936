# Sourced by every simulated login shell (BASH_ENV): `kill` is a bash builtin, so without this the
# real builtin would win over the simulated `kill` on the PATH.
enable -n kill

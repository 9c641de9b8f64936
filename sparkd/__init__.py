"""sparkd: keeps a multi-node vLLM-on-Ray deployment alive over SSH."""

import warnings

# cryptography 51 deprecates DSA and asyncssh still names its DSA types when imported: ten
# lines of a warning meant for asyncssh's maintainers on every start, which broke one-line
# error messages on stderr. Only asyncssh's own DSA warnings are silenced.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")

__version__ = "0.1.0"

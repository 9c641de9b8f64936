import sys

from sparkd_demo.cli import main

sys.exit(main())

"""`python -m sparkd.cli`, as the `sparkd` command."""

from sparkd.cli import main

raise SystemExit(main())

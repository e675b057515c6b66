"""`python -m mvc` runs the CLI."""
import sys

from mvc.cli.main import main

sys.exit(main())

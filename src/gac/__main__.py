import sys

from gac.cli import main

sys.exit(main())

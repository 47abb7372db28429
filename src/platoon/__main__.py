import sys

from platoon.cli import main

sys.exit(main())

import sys

from worldloop.cli import main

sys.exit(main())

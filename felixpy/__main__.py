import sys

from felixpy.cli import main

sys.exit(main())

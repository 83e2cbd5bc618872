import sys

from hiercls.cli import main

sys.exit(main())

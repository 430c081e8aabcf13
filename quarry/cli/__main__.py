"""``python -m quarry.cli``."""

from quarry.cli.root import main

main()

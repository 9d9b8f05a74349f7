"""specrt.cli -- the `specrt` command line (front end: imports specrt.runtime and specrt.compiler).

    main.py       the click group, error handling and exit codes
    commands/     one module per command area (compile/generate/inspect, demo, bench, serve, train)
    demo.py       `specrt demo`;  describe.py  `specrt inspect`;  progress.py  rich progress displays
"""

from specrt.cli.main import main

__all__ = ["main"]

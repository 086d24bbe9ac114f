"""The `moerr` command of an environment that `pip install`ed moerr: the
C++ command lives in the package (moerr/bin/moerr) and is started in
place of this process, with the same arguments, exit code and signals."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "moerr")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"moerr: the command is not installed with this package ({exe} is missing); "
                         "install moerr with pip (README, Install)\n")
        sys.exit(2)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()

"""The `moerr` command of an environment that `pip install`ed moerr: the
C++ command lives in the package (moerr/bin/moerr) and is started in
place of this process, with the same arguments, exit code and signals.

Its RUNPATH finds LibTorch in a `torch` package beside `moerr`; torch can
also be importable from elsewhere (a parent environment through a .pth
file, the user's site directory), so the command is pointed at the lib/
directory of the torch this interpreter would import, found without
importing it."""
import importlib.util
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "moerr")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"moerr: the command is not installed with this package ({exe} is missing); "
                         "install moerr with pip (README, Install)\n")
        sys.exit(2)
    env = dict(os.environ)
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.stderr.write("moerr: torch is not installed in this Python environment; moerr runs on the torch "
                         "it was built against (README, Install)\n")
        sys.exit(2)
    torch_lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (torch_lib, env.get("LD_LIBRARY_PATH")) if p)
    os.execve(exe, [exe] + sys.argv[1:], env)


if __name__ == "__main__":
    main()

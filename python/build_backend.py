"""The shardfit wheel's build (PEP 517): the native parts compiled against
the torch of the Python that installs it, packed with the Python around them.

`pip install ./python` runs build_wheel, which
  1. asks that Python where its torch is (torch.utils.cmake_prefix_path);
  2. configures the repository (the folder above this one) with CMake against
     that torch (cmake/ShardfitTorch.cmake's venv mode, its Python being the
     installing one), in a fresh build folder that is removed afterwards, or
     in $SHARDFIT_BUILD_DIR, which is kept: a folder there already configured
     is reused when its CMakeCache names the same sources and the same torch
     (Torch_DIR), and refused in one line otherwise;
  3. builds the two targets the package needs: `shardfit` (the CLI) and
     `shardfit_torch` (libshardfit_torch.so, the tracer loaded with ctypes);
  4. writes the wheel: python/shardfit/, pytorch/'s tracer modules as
     shardfit.pytorch with the library beside them, the CLI as
     shardfit/bin/shardfit and profiles/*.json as shardfit/profiles/ (the CLI
     looks for profiles in ../profiles from its own folder). Debug sections
     are stripped from the two binaries (a RelWithDebInfo CLI is 240 MB, 5 MB
     without them).

It requires nothing from a package index, so it runs offline and under pip's
build isolation alike. Bad input (no cmake, no torch, a build folder of
another torch) is one line on stderr and exit code 2; pip prints it inside
its "did not run successfully" frame.
"""
import base64
import contextlib
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAME = "shardfit"
TARGETS = ("shardfit", "shardfit_torch")
# pytorch/trace_recorder.py and the modules it imports (trace_recorder.sibling),
# and pytorch/calibrate_stack.py (`shardfit calibrate --stack pytorch`).
TRACER_MODULES = ("trace_recorder", "trace_optimizer", "shardfit_meter", "models", "cpu_flash_attention", "cpu_grouped_mm",
                  "cpu_index_backward", "cuda_attention", "cuda_dropout", "autocast_emulation", "hf_models",
                  "calibrate_stack")
SUMMARY = "Memory planner for sharded data-parallel training: trace a PyTorch model, plan DDP/ZeRO/FSDP"
# What the installing Python says of its torch, one value a line.
TORCH_PROBE = ("import os, torch, torch.utils; print(os.path.dirname(os.path.abspath(torch.__file__))); "
               "print(torch.utils.cmake_prefix_path); print(torch.__version__)")


class BuildError(Exception):
    """Bad input to the build: its one line."""


def version():
    """The CLI's version (cli/CMakeLists.txt's SHARDFIT_VERSION), the wheel's too."""
    path = os.path.join(ROOT, "cli", "CMakeLists.txt")
    if not os.path.exists(path):
        # pip before 21.3 builds a copy of python/ alone, away from the clone.
        raise BuildError("%s: not found beside python/: build from a shardfit clone, with pip 21.3 or later "
                         "(which builds in place)" % path)
    with open(path) as f:
        found = re.search(r'SHARDFIT_VERSION="([^"]+)"', f.read())
    if not found:
        raise BuildError("cli/CMakeLists.txt defines no SHARDFIT_VERSION: is %s a shardfit checkout?" % ROOT)
    return found.group(1)


def dist_info_name():
    return "%s-%s.dist-info" % (NAME, version())


def platform_tag():
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def metadata_files():
    """The dist-info folder's files but RECORD: {name: bytes}."""
    metadata = ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nRequires-Python: >=3.8\n"
                % (NAME, version(), SUMMARY))
    # No Python extension inside (the native parts are loaded with ctypes or
    # run as a program), so any Python 3 on this platform.
    wheel = ("Wheel-Version: 1.0\nGenerator: shardfit build_backend\nRoot-Is-Purelib: false\n"
             "Tag: py3-none-%s\n" % platform_tag())
    entry_points = "[console_scripts]\nshardfit = shardfit.__main__:main\n"
    return {"METADATA": metadata.encode(), "WHEEL": wheel.encode(), "entry_points.txt": entry_points.encode()}


def find_torch():
    """(torch's folder, its cmake prefix, its version, the environment in which
    this Python imports it). Under pip's build isolation this process sees
    only pip's overlay (PYTHONPATH with a sitecustomize that drops the
    environment's site-packages), so the probe runs in a child, first as the
    environment is, then without pip's two variables."""
    env = dict(os.environ)
    bare = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    errors = []
    for candidate in (env, bare):
        probe = subprocess.run([sys.executable, "-c", TORCH_PROBE], env=candidate, capture_output=True, text=True)
        if probe.returncode == 0:
            root, prefix, torch_version = probe.stdout.strip().splitlines()[-3:]
            return root, prefix, torch_version, candidate
        errors.append((probe.stderr.strip().splitlines() or ["exit %d" % probe.returncode])[-1])
    raise BuildError("%s cannot import torch (%s): shardfit builds against the torch of the Python that installs "
                     "it; install torch into this environment first" % (sys.executable, errors[-1]))


def cache_values(cache):
    """A CMakeCache.txt's NAME:TYPE=VALUE lines as {NAME: VALUE}."""
    values = {}
    with open(cache) as f:
        for line in f:
            found = re.match(r"([A-Za-z_][A-Za-z0-9_.-]*):[A-Z]+=(.*)$", line.rstrip("\n"))
            if found:
                values[found.group(1)] = found.group(2)
    return values


def check_tree(tree, torch_prefix):
    """Refuses a configured build folder of other sources or another torch."""
    values = cache_values(os.path.join(tree, "CMakeCache.txt"))
    sources = values.get("CMAKE_HOME_DIRECTORY", "")
    if os.path.realpath(sources) != os.path.realpath(ROOT):
        raise BuildError("SHARDFIT_BUILD_DIR=%s was configured from the sources in %s, not %s: unset it, or name a "
                         "build folder of this checkout" % (tree, sources or "(none named)", ROOT))
    torch_dir = values.get("Torch_DIR", "")
    want = os.path.join(torch_prefix, "Torch")
    if not torch_dir or os.path.realpath(torch_dir) != os.path.realpath(want):
        raise BuildError("SHARDFIT_BUILD_DIR=%s was configured against the torch at %s (its CMakeCache's Torch_DIR), "
                         "not this Python's (%s): unset it, or name a build folder configured for this torch"
                         % (tree, torch_dir or "(none)", want))


def configure(tree, torch_env):
    """A new build folder for the two targets, against the installing Python's
    torch (cmake/ShardfitTorch.cmake's venv mode finds it through that Python:
    the folder holding share/cmake/Torch, torch.utils.cmake_prefix_path)."""
    run(["cmake", "-S", ROOT, "-B", tree, "-DSHARDFIT_LIBTORCH=venv", "-DSHARDFIT_VENV_PYTHON=" + sys.executable,
         "-DCMAKE_BUILD_TYPE=Release", "-DSHARDFIT_BUILD_TESTS=OFF", "-DSHARDFIT_BUILD_BENCHMARKS=OFF"],
        torch_env, "configuring " + tree)


@contextlib.contextmanager
def build_tree(torch_prefix, torch_env):
    """The build folder: $SHARDFIT_BUILD_DIR (reused when configured, else
    configured there; kept either way), or a temporary one."""
    given = os.environ.get("SHARDFIT_BUILD_DIR")
    if given:
        # pip runs this backend in python/, not where it was started.
        if not os.path.isabs(given):
            raise BuildError("SHARDFIT_BUILD_DIR=%s: give an absolute path (pip builds in %s)" % (given, HERE))
        if os.path.exists(os.path.join(given, "CMakeCache.txt")):
            check_tree(given, torch_prefix)
        elif os.path.isdir(given) and os.listdir(given):
            raise BuildError("SHARDFIT_BUILD_DIR=%s: neither a configured build folder (no CMakeCache.txt) nor empty"
                             % given)
        else:
            configure(given, torch_env)
        yield given
        return
    tree = tempfile.mkdtemp(prefix="shardfit-build-")
    try:
        configure(tree, torch_env)
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def run(cmd, env, what):
    """Runs a build step with its output on stderr (pip shows it with -v or on
    failure)."""
    sys.stderr.write("shardfit: %s: %s\n" % (what, " ".join(cmd)))
    sys.stderr.flush()
    try:
        done = subprocess.run(cmd, env=env, stdout=sys.stderr, stderr=sys.stderr)
    except FileNotFoundError:
        raise BuildError("%s not found: the build needs CMake 3.18+ and a C++ compiler, and the C++ libraries "
                         "scripts/install-deps installs on Debian" % cmd[0])
    if done.returncode != 0:
        raise BuildError("%s failed (exit %d): its output is above" % (what, done.returncode))


def build(tree, torch_env):
    jobs = os.environ.get("SHARDFIT_JOBS") or str(os.cpu_count() or 1)
    cmd = ["cmake", "--build", tree, "-j" + jobs]
    for t in TARGETS:
        cmd += ["--target", t]
    run(cmd, torch_env, "building " + ", ".join(TARGETS))
    binary = os.path.join(tree, "cli", "shardfit")
    library = os.path.join(tree, "pytorch", "libshardfit_torch.so")
    for path in (binary, library):
        if not os.path.isfile(path):
            raise BuildError("%s was not built in %s" % (os.path.relpath(path, tree), tree))
    return binary, library


def stripped(path, scratch):
    """A copy of a binary without its debug sections (as built when strip is
    missing)."""
    copy = os.path.join(scratch, os.path.basename(path))
    shutil.copy2(path, copy)
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-debug", copy], check=True)
    return copy


def package_files(binary, library, scratch):
    """[(path in the wheel, file on disk or bytes, executable)] but the dist-info."""
    files = []
    package = os.path.join(HERE, NAME)
    for name in sorted(os.listdir(package)):
        if name.endswith(".py"):
            files.append((NAME + "/" + name, os.path.join(package, name), False))
    files.append((NAME + "/_version.py", ('__version__ = "%s"\n' % version()).encode(), False))
    files.append((NAME + "/pytorch/__init__.py",
                  b'"""pytorch/trace_recorder.py and the modules it imports, copied in by the build."""\n', False))
    for module in TRACER_MODULES:
        files.append((NAME + "/pytorch/%s.py" % module, os.path.join(ROOT, "pytorch", module + ".py"), False))
    files.append((NAME + "/pytorch/libshardfit_torch.so", stripped(library, scratch), True))
    files.append((NAME + "/bin/shardfit", stripped(binary, scratch), True))
    profiles = os.path.join(ROOT, "profiles")
    for name in sorted(os.listdir(profiles)):
        if name.endswith(".json"):
            files.append((NAME + "/profiles/" + name, os.path.join(profiles, name), False))
    return files


def write_wheel(wheel_directory, files):
    """The .whl (a zip with a dist-info folder and its RECORD of hashes); its
    file name."""
    info = dist_info_name()
    files = files + [(info + "/" + n, data, False) for n, data in sorted(metadata_files().items())]
    wheel_name = "%s-%s-py3-none-%s.whl" % (NAME, version(), platform_tag())
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as whl:
        for arcname, source, executable in files:
            data = source if isinstance(source, bytes) else open(source, "rb").read()
            entry = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            entry.compress_type = zipfile.ZIP_DEFLATED
            # A regular file's mode: pip makes a file executable only when its
            # entry says S_IFREG and an x bit.
            entry.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
            whl.writestr(entry, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (arcname, digest, len(data)))
        record.append(info + "/RECORD,,")
        whl.writestr(zipfile.ZipInfo(info + "/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
                     "\n".join(record) + "\n")
    return wheel_name


def failing_in_one_line(hook):
    """A hook whose BuildError is one line on stderr and exit code 2."""
    def wrapped(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except BuildError as e:
            sys.stderr.write("shardfit: %s\n" % e)
            sys.stderr.flush()
            raise SystemExit(2)
    wrapped.__name__, wrapped.__doc__ = hook.__name__, hook.__doc__
    return wrapped


# ---- PEP 517's hooks ------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


@failing_in_one_line
def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = os.path.join(metadata_directory, dist_info_name())
    os.makedirs(info, exist_ok=True)
    for name, data in metadata_files().items():
        with open(os.path.join(info, name), "wb") as f:
            f.write(data)
    return dist_info_name()


@failing_in_one_line
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root, prefix, torch_version, torch_env = find_torch()
    sys.stderr.write("shardfit: building against torch %s (%s)\n" % (torch_version, root))
    with build_tree(prefix, torch_env) as tree:
        binary, library = build(tree, torch_env)
        scratch = tempfile.mkdtemp(prefix="shardfit-wheel-")
        try:
            return write_wheel(wheel_directory, package_files(binary, library, scratch))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

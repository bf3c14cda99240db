"""The Python package (python/) as a user gets it: `pip install ./python`
into a fresh virtual environment that has torch, then the README's Python
example run there, from a folder outside the checkout.

The environment is made with this Python's venv (pip and setuptools from
ensurepip, no network) and sees this Python's torch through a .pth file
(a second torch would be gigabytes). pip runs offline (--no-index) without
build isolation, and the build reuses $SHARDFIT_BUILD_DIR, the build folder
ctest runs in (configured against this torch; the package's build checks
that), so it builds nothing that is not built already. Skipped (exit code
77, with the reason) without $SHARDFIT_BUILD_DIR, with a build folder of
another torch, or with a Python that has no ensurepip."""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from torch_required import ROOT  # noqa: E402 (the skip without torch)
import torch  # noqa: E402

BUILD_DIR = os.environ.get("SHARDFIT_BUILD_DIR", "")
# What the README's example leaves behind, printed for the checks below.
REPORT = """
import json as _json, os as _os, sys as _sys
_model = TinyLM()
print("REPORT " + _json.dumps({"package": shardfit.__file__, "binary": shardfit.binary(), "trace": _os.fspath(trace),
                               "params": sum(p.numel() for p in _model.parameters()), "plan": plan,
                               "prefix": _sys.prefix}))
"""
# Bad input, as a user meets it: one line, as shardfit.BadInput.
BAD_INPUT = """
import json, sys, torch, shardfit
def refused(call):
    try:
        call()
    except shardfit.BadInput as e:
        return str(e)
    raise AssertionError("accepted")
print("PLAN " + json.dumps(refused(lambda: shardfit.plan(sys.argv[1], device="no-such-card", gpus=2))))
class NoLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
    def forward(self, x):
        return self.lin(x)
print("TRACE " + json.dumps(refused(lambda: shardfit.trace(NoLoss, lambda b, s, d: torch.zeros(b, s, 8, device=d),
                                                            seq_len=4))))
"""


def skip_reason():
    """Why this machine cannot run the test, or None."""
    if not BUILD_DIR:
        return "SHARDFIT_BUILD_DIR is not set (ctest sets it to its build folder)"
    try:
        import ensurepip  # noqa: F401
    except ImportError:
        return "%s has no ensurepip to make a virtual environment with (Debian: python3-venv)" % sys.executable
    cache = os.path.join(BUILD_DIR, "CMakeCache.txt")
    torch_dir = ""
    if os.path.exists(cache):
        with open(cache) as f:
            torch_dir = next((line.split("=", 1)[1].strip() for line in f if line.startswith("Torch_DIR:")), "")
    want = os.path.join(torch.utils.cmake_prefix_path, "Torch")
    if os.path.realpath(torch_dir) != os.path.realpath(want):
        return "%s was configured against the torch at %s, not this Python's (%s)" % (BUILD_DIR, torch_dir, want)
    return None


def user_env(**extra):
    """The environment a user's shell has: none of the test suite's pointers
    into the build folder, so the package finds its own binary and library."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SHARDFIT_TORCH_LIB", "SHARDFIT_BINARY", "SHARDFIT_PROFILES", "PYTHONPATH", "PYTHONHOME",
                        "SHARDFIT_BUILD_DIR")}
    env.update(extra)
    return env


def readme_example():
    """The ```python block of the README's "From Python" paragraph."""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    after = text.split("**From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


class PythonPackageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        venv = os.path.join(cls.tmp.name, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        cls.python = os.path.join(venv, "bin", "python")
        site = subprocess.run([cls.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(site, "project-torch.pth"), "w") as f:
            f.write(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))) + "\n")
        cls.install = cls.pip_install(BUILD_DIR)
        assert cls.install.returncode == 0, cls.install.stdout[-4000:]
        cls.user = os.path.join(cls.tmp.name, "user")  # not the checkout: nothing of it on the path
        os.mkdir(cls.user)
        cls.user_tmp = os.path.join(cls.tmp.name, "user-tmp")  # the scripts' temporary folder (TMPDIR)
        os.mkdir(cls.user_tmp)
        cls.example = cls.run_script("example.py", readme_example() + REPORT)
        assert cls.example.returncode == 0, cls.example.stdout[-4000:]
        cls.report = json.loads(cls.example.stdout.split("REPORT ", 1)[1])

    @classmethod
    def pip_install(cls, build_dir):
        return subprocess.run([cls.python, "-m", "pip", "install", "--no-index", "--no-build-isolation",
                               "--disable-pip-version-check", os.path.join(ROOT, "python")],
                              env=user_env(SHARDFIT_BUILD_DIR=build_dir), cwd=cls.tmp.name, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=900)

    @classmethod
    def run_script(cls, name, code, *args):
        path = os.path.join(cls.user, name)
        with open(path, "w") as f:
            f.write(code)
        return subprocess.run([cls.python, path] + list(args), env=user_env(TMPDIR=cls.user_tmp), cwd=cls.user,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)

    def test_the_package_is_installed_with_its_own_cli_built_against_this_torch(self):
        package = os.path.dirname(self.report["package"])
        self.assertTrue(package.startswith(self.report["prefix"] + os.sep), package)
        self.assertEqual(self.report["binary"], os.path.join(package, "bin", "shardfit"))
        for shipped in ("pytorch/libshardfit_torch.so", "pytorch/trace_recorder.py", "profiles/a100-80gb.json"):
            self.assertTrue(os.path.isfile(os.path.join(package, shipped)), shipped)
        # The `shardfit` command in the environment runs that binary.
        version = subprocess.run([os.path.join(os.path.dirname(self.python), "shardfit"), "--version"],
                                 capture_output=True, text=True, env=user_env(), timeout=60)
        self.assertEqual(version.returncode, 0, version.stderr)
        self.assertIn("LibTorch " + torch.__version__.split("+")[0], version.stdout)

    def test_the_readme_example_traces_the_model_and_plans_it(self):
        # In the temporary folder of the user's environment, where trace() puts it.
        self.assertEqual(os.path.dirname(self.report["trace"]), self.user_tmp)
        with open(self.report["trace"]) as f:
            trace = json.load(f)
        self.assertEqual(trace["schema"], "shardfit.trace/1")
        self.assertEqual(trace["model"]["name"], "TinyLM")
        self.assertEqual(trace["model"]["params"], self.report["params"])
        plan = self.report["plan"]
        self.assertEqual(plan["schema"], "shardfit.plan/1")
        self.assertEqual((plan["stack"], plan["model"]["params"]), ("pytorch", self.report["params"]))
        self.assertEqual((plan["hardware"]["profile"], plan["hardware"]["gpus_per_node"]), ("a100-80gb", 8))
        chosen = [c for c in plan["candidates"] if c["id"] == plan["chosen"]]
        self.assertEqual(len(chosen), 1, plan["chosen"])
        self.assertGreater(chosen[0]["max_batch_per_gpu"], 0)
        # What the example prints.
        self.assertIn("%s fits batch %d per GPU" % (chosen[0]["id"], chosen[0]["max_batch_per_gpu"]),
                      self.example.stdout)

    def test_bad_input_is_one_line_as_bad_input(self):
        out = self.run_script("bad.py", BAD_INPUT, self.report["trace"])
        self.assertEqual(out.returncode, 0, out.stdout[-4000:])
        said = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()
                if line.startswith(("PLAN ", "TRACE "))}
        for what, line in said.items():
            self.assertNotIn("\n", line.strip(), what)
        self.assertIn("unknown device profile 'no-such-card'", said["PLAN"])
        self.assertIn("forward must return the loss", said["TRACE"])
        # The refused trace leaves no file behind in the temporary folder.
        self.assertEqual([f for f in os.listdir(self.user_tmp) if f.startswith("NoLoss-")], [])

    def test_a_build_folder_of_another_torch_is_refused_in_one_line(self):
        other = os.path.join(self.tmp.name, "other-build")
        os.mkdir(other)
        with open(os.path.join(other, "CMakeCache.txt"), "w") as f:
            f.write("CMAKE_HOME_DIRECTORY:INTERNAL=%s\nTorch_DIR:PATH=/elsewhere/torch/share/cmake/Torch\n" % ROOT)
        out = self.pip_install(other)
        self.assertNotEqual(out.returncode, 0, out.stdout[-4000:])
        refusals = [line for line in out.stdout.splitlines() if "was configured against the torch at" in line]
        self.assertEqual(len(refusals), 1, out.stdout[-4000:])
        self.assertIn("SHARDFIT_BUILD_DIR=%s was configured against the torch at /elsewhere/torch" % other,
                      refusals[0])


if __name__ == "__main__":
    reason = skip_reason()
    if reason:
        print("skipped: " + reason)
        sys.exit(77)
    unittest.main()

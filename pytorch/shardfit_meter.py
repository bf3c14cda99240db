"""The shardfit meter inside a PyTorch process.

Loads libshardfit_torch.so (pytorch/meter_capi.cc) with ctypes and
installs the engine's tracking allocator as LibTorch's CPU allocator, so that
every CPU storage this process allocates from then on is counted as
`shardfit run` counts its own: the bytes each storage asks for, their peak,
and a timeline at named phases. Works in the Python whose torch is the
LibTorch shardfit builds against (.venv's, the pinned stack).

    import torch, shardfit_meter
    meter = shardfit_meter.Meter()       # install: counting starts now
    ...build the model, train...
    meter.mark("step1/forward")
    print(meter.peak, meter.timeline())

The library is the one beside this file when it is installed in the
shardfit package (python/ builds them together), else $SHARDFIT_TORCH_LIB,
else build/pytorch/ beside this file's repository.
"""
import ctypes
import os

_LIB = None
_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)


def library_path():
    here = os.path.dirname(os.path.abspath(__file__))
    installed = os.path.join(here, "libshardfit_torch.so")
    if os.path.exists(installed):
        return installed
    env = os.environ.get("SHARDFIT_TORCH_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(here), "build", "pytorch", "libshardfit_torch.so")


def load_library():
    """libshardfit_torch.so, loaded once (after torch), with the meter's signatures set."""
    global _LIB
    if _LIB is not None:
        return _LIB
    import torch  # noqa: F401  (LibTorch first: the library resolves against the loaded c10)
    path = library_path()
    if not os.path.exists(path):
        raise FileNotFoundError("shardfit meter library not found: %s (build shardfit, or set "
                                "SHARDFIT_TORCH_LIB)" % path)
    lib = ctypes.CDLL(path)
    i64 = ctypes.c_int64
    for name in ("install", "allocated", "peak", "num_allocs", "timeline_size"):
        getattr(lib, "shardfit_meter_" + name).restype = i64
        getattr(lib, "shardfit_meter_" + name).argtypes = []
    lib.shardfit_meter_reset_peak.argtypes = []
    lib.shardfit_meter_set_budget.argtypes = [i64]
    lib.shardfit_meter_mark.argtypes = [ctypes.c_char_p]
    lib.shardfit_meter_set_observer.argtypes = [_OBSERVER]
    lib.shardfit_meter_watch_begin.argtypes = []
    lib.shardfit_meter_watch_settle.restype = i64
    lib.shardfit_meter_watch_settle.argtypes = [i64, ctypes.POINTER(i64)]
    lib.shardfit_meter_timeline_point.restype = ctypes.c_int
    lib.shardfit_meter_timeline_point.argtypes = [i64, ctypes.c_char_p, i64,
                                                  ctypes.POINTER(i64), ctypes.POINTER(i64)]
    _LIB = lib
    return lib


class Meter:
    """The process's CPU meter. Creating one installs it (once per process)."""

    def __init__(self):
        self._lib = load_library()
        self.at_install = self._lib.shardfit_meter_install()

    @property
    def allocated(self):
        """Bytes of CPU storages live now (counted since the meter was installed)."""
        return self._lib.shardfit_meter_allocated()

    @property
    def peak(self):
        """The highest `allocated` since install or the last reset_peak()."""
        return self._lib.shardfit_meter_peak()

    @property
    def num_allocs(self):
        return self._lib.shardfit_meter_num_allocs()

    def reset_peak(self):
        self._lib.shardfit_meter_reset_peak()

    def set_budget(self, nbytes):
        """Past `nbytes` live (0: none) an allocation raises PyTorch's out-of-memory error."""
        self._lib.shardfit_meter_set_budget(int(nbytes))

    def mark(self, label):
        self._lib.shardfit_meter_mark(label.encode())

    def watch(self):
        """From now on, note the storages allocated on the calling thread;
        returns settle(timeout_s), which stops noting and waits (at most
        `timeout_s`) until every noted storage is freed again, on any thread,
        and returns (whether any was still live when it was called, whether
        any still is). For a collective whose input copies die on the process
        group's worker thread after the call returned (validate.Settled).
        Allocates nothing."""
        lib = self._lib
        lib.shardfit_meter_watch_begin()

        def settle(timeout_s):
            live = ctypes.c_int64(0)
            left = lib.shardfit_meter_watch_settle(int(timeout_s * 1000), ctypes.byref(live))
            return live.value > 0, left > 0
        return settle

    def log_allocations(self, phase=lambda: ""):
        """From now on, every allocation and release appended to the list
        returned, in the order they happen: [kind, bytes, phase(), where],
        kind "alloc" or "free" (a free's bytes those of its allocation),
        where the innermost frames of Python code making it (a thread
        without Python: ""; for a free, "#N": the index of its allocation
        in the list). For finding the storage a prediction misses; slow, so
        never on in a measured run."""
        import traceback
        log, live = [], {}

        def observe(data, nbytes):
            if nbytes > 0:
                live[data] = (nbytes, len(log))
                frames = traceback.extract_stack()[:-1][-4:]
                where = " < ".join("%s:%d %s" % (os.path.basename(f.filename), f.lineno, f.name)
                                   for f in reversed(frames))
                log.append(["alloc", nbytes, phase(), where])
            elif data in live:
                nbytes, index = live.pop(data)
                log.append(["free", nbytes, phase(), "#%d" % index])

        self._observer = _OBSERVER(observe)  # kept: the library holds a raw pointer to it
        self._lib.shardfit_meter_set_observer(self._observer)
        return log

    def timeline(self):
        """[{"phase", "allocated_bytes", "peak_allocated_bytes"}], as `run`'s reports write them."""
        out = []
        buf = ctypes.create_string_buffer(512)
        alloc, peak = ctypes.c_int64(), ctypes.c_int64()
        for i in range(self._lib.shardfit_meter_timeline_size()):
            if self._lib.shardfit_meter_timeline_point(i, buf, len(buf), ctypes.byref(alloc),
                                                       ctypes.byref(peak)) == 0:
                out.append({"phase": buf.value.decode(), "allocated_bytes": alloc.value,
                            "peak_allocated_bytes": peak.value})
        return out

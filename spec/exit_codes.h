// SPEC.md's exit codes, defined once: the CLI returns them, the launcher
// reads its ranks' with them, tests compare against them.
#pragma once

namespace shardfit::spec {

constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;  // a check failed (validate, verify, a diverged run)
constexpr int kExitBadInput = 2;     // bad input, one line naming it
constexpr int kExitEnvironment = 3;  // a rank died, a rendezvous timed out, a collective failed
constexpr int kExitOom = 4;          // `run`: a rank went out of memory (report written); --oom-ok: 0

}  // namespace shardfit::spec

// `shardfit verify CKPT|FILE`: checks a checkpoint's (or one rank file's, or
// an exported safetensors file's) data against the checksums written with
// it. Exit 0 when every byte matches, 2 naming the file and the tensor
// otherwise (a corrupt file is bad input to whatever reads it next).
#include <cstdio>

#include "cli/commands.h"
#include "executor/checkpoint_format.h"

namespace shardfit::cli {

Command add_verify_command(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "verify",
      "Check the data checksums (xxh3) of a checkpoint directory (every rank file, against its "
      "manifest), one rank file, or a safetensors file written by `run --export`");
  auto path = std::make_shared<std::string>();
  sub->add_option(
         "PATH", *path,
         "A step-NNNNNN checkpoint directory, a .shardfit rank file or a .safetensors file")
      ->required();
  return {sub, [path] {
            const auto s = executor::ckpt::verify_path(*path);
            std::printf(
                "ok: %s %s: %d file%s, %lld tensors, %lld data bytes match their checksums\n",
                s.what.c_str(), path->c_str(), s.files, s.files == 1 ? "" : "s",
                static_cast<long long>(s.tensors), static_cast<long long>(s.bytes));
            return kExitOk;
          }};
}

}  // namespace shardfit::cli

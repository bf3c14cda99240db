// TEST-ONLY STAND-IN, not PyTorch's file: LibTorch's generated version header
// (torch/csrc/api/include/torch/version.h in an installed LibTorch), written
// by hand for tests/compat/. Defaults to 2.11.0, the torch on the device
// machine's image (/work/.library/device/KINDS.md, "python3's torch is
// 2.11.0+cu130"); -DSHARDFIT_STANDIN_TORCH_MINOR=N makes it 2.N.0.
#pragma once

#ifndef SHARDFIT_STANDIN_TORCH_MINOR
#define SHARDFIT_STANDIN_TORCH_MINOR 11
#endif

#define TORCH_VERSION_MAJOR 2
#define TORCH_VERSION_MINOR SHARDFIT_STANDIN_TORCH_MINOR
#define TORCH_VERSION_PATCH 0
#define TORCH_VERSION "2.x (tests/compat stand-in)"

// Named clusters built from published hardware numbers, and the catalogue of device
// types they use. Every number, with its source, is in cluster_presets.cc.
//
//   name               nodes = n                                   ranks
//   "dgx-a100"         n DGX A100: 8 x A100 80GB SXM4, NVSwitch, 8 x HDR IB   8n
//   "dgx-h100"         n DGX H100: 8 x H100 80GB SXM5, NVSwitch, 8 x NDR IB   8n
//   "v100"             n DGX-1V:   8 x V100 32GB SXM2, NVLink cube mesh, 4 x EDR IB   8n
//   "mixed-a100-v100"  n = 1: one PCIe machine holding 4 x A100 80GB PCIe + 4 x V100 32GB PCIe
//                      (the small heterogeneous case: ranks 0-3 A100, 4-7 V100)      8
//                      n >= 2: ceil(n/2) DGX A100 nodes then floor(n/2) DGX-1V nodes  8n
//   "cpu"              this machine: ONE node running n processes (n = the Gloo world
//                      size); conservative numbers per process, see the .cc       n
//
// Link levels are per device and per direction (cluster.h): an NVLink figure quoted as
// "600 GB/s" bidirectional per GPU is 300 GB/s here, and a node's NICs are shared out
// per GPU. Peak FLOP/s are dense (no 2:4 sparsity).
//
// Errors: an unknown name is a support::ValidationError listing the known names; n < 1
// is a ValidationError.
//
// Worked example:
//   Cluster c = preset("dgx-h100", 4);     // 32 ranks, links nvswitch < infiniband
//   c.device_of(0).peak_flops.bf16;         // 9.895e14
//   preset("mixed-a100-v100", 1).device_of(5).name;   // "v100-pcie-32gb"
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cost/cluster.h"

namespace shardwise::cost {

// The preset called `name` with `nodes` nodes ("cpu": processes on the one node).
Cluster preset(std::string_view name, int nodes = 1);

// The names preset() knows, sorted.
std::vector<std::string> preset_names();

// Every device type the presets use, one entry per name (for code that describes a
// machine it finds, e.g. shardwise.Cluster.detect() matching a GPU's name).
std::vector<DeviceType> known_device_types();

}  // namespace shardwise::cost

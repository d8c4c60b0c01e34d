// The optimizer ops' argument checks, shared by cpu/optimizer.cpp and cuda/embed_optim_optimizer.cu
// (formulas and hp layout: cpu/optimizer.cpp's header), and the layout of their inputs.
//   global_norm  (g0, g1, ...) -> (norm[1] f32); absent inputs skipped
//   adamw        (hp[8] f32, [norm[1] f32], then (param, [master], grad, m, v) per group)
//   adamw8       (hp[8] f32, [norm[1] f32], then (param, [master], grad, m_q u8, m_scale f32,
//                v_q u8, v_scale f32) per group); 8-bit states in blocks of kQBlock elements
// Only shapes, dtypes, strides and the no_decay attr: hp's values are host memory on the CPU
// (which checks them) and device memory on CUDA.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "runtime/op_registry.h"

namespace surogate {

namespace adam {
constexpr int kGroup = 5;  // adamw: param, master, grad, m, v
enum Slot { kParam = 0, kMaster, kGrad, kM, kV };
constexpr int kGroup8 = 7;  // adamw8: param, master, grad, m_q, m_scale, v_q, v_scale
enum Slot8 { kP8 = 0, kMaster8, kGrad8, kMQ, kMScale, kVQ, kVScale };
constexpr int64_t kQBlock = 256;  // adamw8: elements per quantization block (one scale each)
inline int64_t num_qblocks(int64_t n) { return (n + kQBlock - 1) / kQBlock; }
}  // namespace adam

Status check_global_norm(const OpArgs& a);

struct AdamwArgs {
  int n_groups = 0;
  std::vector<char> decay;  // per group: 0 when the attr no_decay names it, else 1
};
Status check_adamw(const OpArgs& a, AdamwArgs* r);
Status check_adamw8(const OpArgs& a, AdamwArgs* r);

// Muon / NorMuon (cpu/muon.cpp's header has the math; the Newton-Schulz iterations between the
// two ops are the Program's own matmuls):
//   muon_momentum (hp[8] f32, [norm[1] f32], grad[R,C], m[R,C] f32) -> (x f32 [R,C], or [C,R] with
//                 attr transpose); m updated in place; attr nesterov
//   muon_update   (hp[8] f32, o f32 [R,C] or [C,R] (transpose), param[R,C], [master[R,C] f32],
//                 [v f32, one per row of param]) -> (); param, master, v updated in place; NorMuon exactly when v is
//                 given; attrs transpose, cautious, scale (Muon's shape factor)
// attrs row0 / rows: a row range of grad, m, param and master (one part of a fused projection).
struct MuonArgs {
  int64_t row0 = 0, rows = 0, cols = 0;
  bool transpose = false;
};
Status check_muon_momentum(const OpArgs& a, MuonArgs* r);
Status check_muon_update(const OpArgs& a, MuonArgs* r);

}  // namespace surogate

// Calls the public C++ API of an installed ringattn on the CPU: one causal GQA attention through
// the Backend interface, checked against the fp64 oracle. Exits non-zero on a wrong answer.
#include <cmath>
#include <cstdio>
#include <vector>

#include <ringattn/runner/problem/inputs.hpp>
#include <ringattn/kernels/backend.hpp>
#include <ringattn/kernels/cpu/cpu_kernels.hpp>

int main() {
  using namespace ringattn;
  const int64_t B = 1, H = 4, HKV = 2, T = 96, D = 64;
  std::vector<float> q(B * H * T * D), k(B * HKV * T * D), v(B * HKV * T * D), o(B * H * T * D, NAN),
      lse(B * H * T, NAN);
  FlashParams p;
  p.q = bhtd_view(q.data(), DType::F32, B, H, T, D);
  p.k = bhtd_view(k.data(), DType::F32, B, HKV, T, D);
  p.v = bhtd_view(v.data(), DType::F32, B, HKV, T, D);
  fill_input(p.q, 7, InputTensor::Q, 0, 1);
  fill_input(p.k, 7, InputTensor::K, 0, 1);
  fill_input(p.v, 7, InputTensor::V, 0, 1);
  p.state = contiguous_state(o.data(), lse.data(), B, H, T, D);
  p.scale = 1.f / std::sqrt(float(D));
  p.mask.causal = true;
  auto backend = make_cpu_backend();
  backend->flash(p);
  const auto ref = cpu::naive_attention(p);
  double worst = 0;
  for (size_t i = 0; i < o.size(); ++i) worst = std::fmax(worst, std::fabs(o[i] - ref.o[i]));
  std::printf("consumer: max abs error %.3g against the fp64 oracle\n", worst);
  return worst < 1e-4 ? 0 : 1;
}

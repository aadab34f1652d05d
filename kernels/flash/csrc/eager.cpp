// Eager flash attention with no Python between the call and the kernels: the autograd node, the
// allocations and the launches of the compiled Triton kernels, in C++.
//
// Why: at ViT sizes the GPU work of one call is about what Python costs to launch it, so at batch 16
// the GPU waits for Python. One forward+backward at (256, 12, 197, 64), measured on the H200's host in
// one run: 0.183 ms of CPU through this file, 0.404 ms through the Python autograd.Function and
// launcher, 0.183 ms for SDPA (benchmarks/results/flash_native_h200/launch_overhead.log).
//
// How: every launch has a key (kernel slot, device, q's shape, the integer arguments, each tensor's
// dtype and 16-byte alignment, the constexpr flags): everything Triton specialises a compiled kernel
// on (kernels/flash/launch.py says what that is), and more. The first launch of a key calls back
// into Python (kernels/flash/native.py: `_first_launch`), which launches through Triton's own path,
// so Triton autotunes and compiles as always, and returns the plan it used: the CUfunction, the
// grid, the block, the shared memory and each argument's kernel type. Later launches of the key
// pass the same arguments to the same CUfunction with cuLaunchKernel: the same binary, arguments
// and grid, so bitwise the same results (tests/test_flash_native.py checks it on the GPU).
//
// The argument lists below mirror kernels/flash/op.py's launch_fwd / launch_dq / launch_dkdv, which
// the torch.library ops (torch.compile's path) use; the GPU tests compare the two paths bitwise.
// No CUDA headers are needed: the few driver types are declared here and libcuda is opened at the
// first launch, so the file builds with a plain C++ compiler on any machine with torch.
#include "once_differentiable.h"
#include "packed_views.h"
#include <torch/extension.h>

#include <dlfcn.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---------------------------------------------------------------------------------------------
// The CUDA driver's launch entry point (cuda.h's types, declared: ABI-stable since CUDA 4.0)
// ---------------------------------------------------------------------------------------------
using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, CUstream, void**, void**);
using GetErrorString = CUresult (*)(CUresult, const char**);

struct Driver {
  LaunchKernel launch = nullptr;
  GetErrorString error_string = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "flash eager launcher: cannot open libcuda.so.1 (", dlerror(), ")");
    Driver found;
    found.launch = reinterpret_cast<LaunchKernel>(dlsym(lib, "cuLaunchKernel"));
    found.error_string = reinterpret_cast<GetErrorString>(dlsym(lib, "cuGetErrorString"));
    TORCH_CHECK(found.launch != nullptr, "flash eager launcher: libcuda.so.1 has no cuLaunchKernel");
    return found;
  }();
  return d;
}

// ---------------------------------------------------------------------------------------------
// Launch plans, one per key
// ---------------------------------------------------------------------------------------------
enum Slot : int64_t { kFwd = 0, kDq = 1, kDkdv = 2 };

struct Args {  // one launch's arguments in the kernel's order: tensors, then floats, then ints
  std::vector<at::Tensor> tensors;
  std::vector<double> floats;
  std::vector<int64_t> ints;
  std::vector<int64_t> flags;  // the constexprs that shapes and strides do not fix
};

struct Plan {
  CUfunction function = nullptr;  // nullptr: this key always takes Triton's own path; alive: native._PLANNED
  unsigned grid = 0, block = 0, shared = 0;
  std::string types;  // per argument: 'p' pointer, 'i' int32, 'l' int64, 'f' fp32, 'c' baked in (not passed)
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const {
    size_t h = key.size();
    for (int64_t x : key) h ^= std::hash<int64_t>{}(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

std::mutex plans_mutex;
std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Plan>, KeyHash> plans;
py::object* first_launch = nullptr;  // Python's kernels.flash.native._first_launch; never freed (exit order)
double log2e = 0.0;                  // kernels.flash.kernels.LOG2E, set with the handler
std::atomic<int64_t> direct_launches{0};  // launches that skipped Python (tests read it; any thread)

std::vector<int64_t> key_of(Slot slot, const at::Tensor& q, const Args& a) {
  std::vector<int64_t> key = {slot, q.get_device()};
  for (int64_t s : q.sizes()) key.push_back(s);
  key.insert(key.end(), a.flags.begin(), a.flags.end());
  key.insert(key.end(), a.ints.begin(), a.ints.end());
  for (const auto& t : a.tensors) {
    auto aligned = reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    key.push_back(static_cast<int64_t>(t.scalar_type()) * 2 + (aligned ? 1 : 0));
  }
  return key;
}

// Triton's own launch, through Python; returns the plan the handler gave.
Plan launch_through_python(Slot slot, const at::Tensor& q, const Args& a) {
  TORCH_CHECK(first_launch != nullptr, "flash eager launcher: kernels.flash.native did not install its handler");
  py::gil_scoped_acquire gil;
  py::tuple args(a.tensors.size() + a.floats.size() + a.ints.size());
  size_t i = 0;
  for (const auto& t : a.tensors) args[i++] = py::cast(t);
  for (double f : a.floats) args[i++] = py::float_(f);
  for (int64_t n : a.ints) args[i++] = py::int_(n);
  py::object plan = (*first_launch)(static_cast<int64_t>(slot), q, args, py::cast(a.flags));
  Plan p;
  if (!plan.is_none()) {
    auto t = plan.cast<std::tuple<uintptr_t, unsigned, unsigned, unsigned, std::string>>();
    p.function = reinterpret_cast<CUfunction>(std::get<0>(t));
    std::tie(std::ignore, p.grid, p.block, p.shared, p.types) = t;
    TORCH_CHECK(p.types.size() == args.size(), "flash eager launcher: plan has ", p.types.size(),
                " argument types for ", args.size(), " arguments");
  }
  return p;
}

void launch_direct(const Plan& p, const Args& a, const at::Device& device) {
  if (p.grid == 0) return;  // B·H = 0: Triton's launcher skips an empty grid, cuLaunchKernel would fail on it
  union Value { void* ptr; int32_t i32; int64_t i64; float f32; };
  std::array<Value, 66> values;
  std::array<void*, 66> params;
  TORCH_CHECK(p.types.size() + 2 <= values.size(), "flash eager launcher: too many kernel arguments");
  size_t arg = 0, n = 0;
  auto next = [&]() -> Value& { params[n] = &values[n]; return values[n++]; };
  for (const auto& t : a.tensors) {
    if (p.types[arg++] != 'c') next().ptr = t.data_ptr();
  }
  for (double f : a.floats) {
    if (p.types[arg++] != 'c') next().f32 = static_cast<float>(f);
  }
  for (int64_t x : a.ints) {
    char ty = p.types[arg++];
    if (ty == 'i') next().i32 = static_cast<int32_t>(x);
    else if (ty == 'l') next().i64 = x;
  }
  next().ptr = nullptr;  // Triton's two trailing parameters: global and profile scratch (the plan has neither)
  next().ptr = nullptr;
  auto stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).native_handle();
  CUresult rc = driver().launch(p.function, p.grid, 1, 1, p.block, 1, 1, p.shared, stream, params.data(), nullptr);
  if (rc != 0) {
    const char* what = "unknown error";
    if (driver().error_string) driver().error_string(rc, &what);
    TORCH_CHECK(false, "flash eager launcher: cuLaunchKernel failed: ", what, " (", rc, ")");
  }
  ++direct_launches;
}

void launch(Slot slot, const at::Tensor& q, const Args& a) {
  auto key = key_of(slot, q, a);
  std::shared_ptr<const Plan> found;  // a copy of the pointer, taken under the lock: clear_plans cannot free it
  {
    std::lock_guard<std::mutex> lock(plans_mutex);
    auto it = plans.find(key);
    if (it != plans.end()) found = it->second;
  }
  if (found != nullptr && found->function != nullptr) return launch_direct(*found, a, q.device());
  auto fresh = std::make_shared<const Plan>(launch_through_python(slot, q, a));
  if (found == nullptr) {
    std::lock_guard<std::mutex> lock(plans_mutex);
    plans.emplace(std::move(key), std::move(fresh));
  }
}

// ---------------------------------------------------------------------------------------------
// The three launches (argument order: kernels/flash/op.py, launch_fwd / launch_dq / launch_dkdv)
// ---------------------------------------------------------------------------------------------
void append_strides(std::vector<int64_t>& ints, std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) ints.insert(ints.end(), t->strides().begin(), t->strides().end());
}

int64_t n_bucket(int64_t n) {  // kernels/flash/configs.py n_bucket: next power of two in [128, 8192]
  int64_t p = 1;
  while (p < n) p <<= 1;
  return std::min<int64_t>(std::max<int64_t>(p, 128), 8192);
}

void tail(std::vector<int64_t>& ints, const at::Tensor& q) {
  ints.insert(ints.end(), {q.size(1), q.size(2), n_bucket(q.size(2))});
}

// out and lse of q, k, v (B, H, N, d); res (out's rounding residual) written when defined.
std::tuple<at::Tensor, at::Tensor> forward_kernels(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   double scale, bool unscaled, const at::Tensor& res) {
  const int64_t B = q.size(0), H = q.size(1), N = q.size(2), d = q.size(3);
  auto out = at::empty({B, N, H, d}, q.options()).transpose(1, 2);  // (B, H, N, d), laid out (B, N, H, d) as SDPA's
  auto lse = at::empty({B, H, N}, q.options().dtype(at::kFloat));   // (B, H, N), natural log
  const bool store_res = res.defined();
  Args a{{q, k, v, out, lse, store_res ? res : out}, {scale * log2e}, {}, {store_res, unscaled || store_res}};
  append_strides(a.ints, {&q, &k, &v, &out});
  tail(a.ints, q);
  launch(kFwd, q, a);
  return {out, lse};
}

// dq, dk, dv (preallocated, any strides) for one backward: the dQ kernel (which writes delta), then dK/dV.
void backward_kernels(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& out, const at::Tensor& lse, const at::Tensor& res, double scale,
                      const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv) {
  auto delta = at::empty(lse.sizes(), lse.options());  // (B, H, N), rowsum(dO ∘ O)
  const bool add_res = res.defined();
  Args a{{q, k, v, dout, dq, out, add_res ? res : out, lse, delta}, {scale, scale * log2e}, {}, {add_res}};
  append_strides(a.ints, {&q, &k, &v, &dout, &dq, &out});
  tail(a.ints, q);
  launch(kDq, q, a);
  Args b{{q, k, v, dout, dk, dv, lse, delta}, {scale, scale * log2e}, {}, {add_res}};  // SPLIT_DS with fp32_delta
  append_strides(b.ints, {&q, &k, &v, &dout, &dk, &dv});
  tail(b.ints, q);
  launch(kDkdv, q, b);
}

at::Tensor residual_for(const at::Tensor& q, bool keep_res) {
  if (!keep_res) return at::Tensor();
  return at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);  // as out
}

// ---------------------------------------------------------------------------------------------
// Autograd: saves q, k, v (or qkv), out, lse (and res) only, as the op path does
// ---------------------------------------------------------------------------------------------
struct Attention : public torch::autograd::Function<Attention> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor q, at::Tensor k, at::Tensor v, double scale,
                            bool fp32_delta, bool keep_res) {
    auto res = residual_for(q, keep_res);
    auto [out, lse] = forward_kernels(q, k, v, scale, fp32_delta, res);
    ctx->save_for_backward({q, k, v, out, lse, res});
    ctx->saved_data["scale"] = scale;
    return out;  // (B, H, N, d)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();  // q, k, v, out, lse, res
    auto dq = at::empty(s[0].sizes(), s[0].options());
    auto dk = at::empty(s[1].sizes(), s[1].options());
    auto dv = at::empty(s[2].sizes(), s[2].options());
    backward_kernels(grads[0], s[0], s[1], s[2], s[3], s[4], s[5], ctx->saved_data["scale"].toDouble(), dq, dk, dv);
    auto d = vitk::once_differentiable({dq, dk, dv}, grads[0], "flash");
    return {d[0], d[1], d[2], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct AttentionQKVPacked : public torch::autograd::Function<AttentionQKVPacked> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor qkv, double scale, bool fp32_delta, bool keep_res) {
    auto [q, k, v] = vitk::packed_views(qkv);
    auto res = residual_for(q, keep_res);
    auto [out, lse] = forward_kernels(q, k, v, scale, fp32_delta, res);
    ctx->save_for_backward({qkv, out, lse, res});
    ctx->saved_data["scale"] = scale;
    return out;  // (B, H, N, d)
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();  // qkv, out, lse, res
    auto dqkv = at::empty(s[0].sizes(), s[0].options());  // (B, N, 3, H, d): the three gradients in place
    auto [q, k, v] = vitk::packed_views(s[0]);
    auto [dq, dk, dv] = vitk::packed_views(dqkv);
    backward_kernels(grads[0], q, k, v, s[1], s[2], s[3], ctx->saved_data["scale"].toDouble(), dq, dk, dv);
    return {vitk::once_differentiable({dqkv}, grads[0], "flash")[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

bool wants_res(bool fp32_delta, std::initializer_list<const at::Tensor*> inputs) {
  if (!fp32_delta || !torch::autograd::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : inputs) {
    if (t->requires_grad()) return true;
  }
  return false;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale, bool fp32_delta) {
  c10::DeviceGuard guard(q.device());  // Triton's first launch and the stream follow the current device
  return Attention::apply(q, k, v, scale, fp32_delta, wants_res(fp32_delta, {&q, &k, &v}));
}

at::Tensor attention_qkvpacked(const at::Tensor& qkv, double scale, bool fp32_delta) {
  c10::DeviceGuard guard(qkv.device());
  return AttentionQKVPacked::apply(qkv, scale, fp32_delta, wants_res(fp32_delta, {&qkv}));
}

// The packed backward: the CUDA (and, for the interpreter's tests, CPU) kernel of vit_flash_native::bwd_qkvpacked,
// the op that the torch.library autograd formula of vit_flash::fwd_qkvpacked calls (kernels/flash/op.py defines it,
// with a Python kernel for every device until this file is loaded). A torch.compile graph's backward then reaches
// the kernels through the dispatcher and this file, not through a Python custom op.
at::Tensor bwd_qkvpacked_op(const at::Tensor& dout, const at::Tensor& qkv, const at::Tensor& out, const at::Tensor& lse,
                            const std::optional<at::Tensor>& res, double softmax_scale) {
  c10::DeviceGuard guard(qkv.device());
  auto dqkv = at::empty(qkv.sizes(), qkv.options());  // (B, N, 3, H, d)
  auto [q, k, v] = vitk::packed_views(qkv);
  auto [dq, dk, dv] = vitk::packed_views(dqkv);
  backward_kernels(dout, q, k, v, out, lse, res.value_or(at::Tensor()), softmax_scale, dq, dk, dv);
  return dqkv;
}

void set_first_launch(py::object handler, double log2e_value) {
  first_launch = new py::object(std::move(handler));
  log2e = log2e_value;
}

int64_t direct_launch_count() { return direct_launches; }

void clear_plans() {
  std::lock_guard<std::mutex> lock(plans_mutex);
  plans.clear();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Eager flash attention: C++ autograd and direct launches of the compiled Triton kernels";
  m.def("attention", &attention, "out (B, H, N, d) of q, k, v (B, H, N, d); differentiable", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("softmax_scale"), py::arg("fp32_delta"));
  m.def("attention_qkvpacked", &attention_qkvpacked, "out (B, H, N, d) of a packed qkv (B, N, 3, H, d)",
        py::arg("qkv"), py::arg("softmax_scale"), py::arg("fp32_delta"));
  m.def("set_first_launch", &set_first_launch, "install the Python handler of a key's first launch, and LOG2E");
  m.def("direct_launch_count", &direct_launch_count, "launches so far that did not go through Python");
  m.def("clear_plans", &clear_plans, "forget every cached plan (the next launch of each key goes through Python)");
  m.def("bwd_qkvpacked", &bwd_qkvpacked_op, "dqkv (B, N, 3, H, d) of a packed forward; res: fp32_delta's or None",
        py::arg("dout"), py::arg("qkv"), py::arg("out"), py::arg("lse"), py::arg("res"), py::arg("softmax_scale"));
}

// A kernel registered for a backend key takes precedence over the op's CompositeExplicitAutograd Python kernel.
TORCH_LIBRARY_IMPL(vit_flash_native, CUDA, m) {
  m.impl("bwd_qkvpacked", &bwd_qkvpacked_op);
}

// The CPU: under Triton's interpreter (tests), where every launch goes through Python.
TORCH_LIBRARY_IMPL(vit_flash_native, CPU, m) {
  m.impl("bwd_qkvpacked", &bwd_qkvpacked_op);
}

#include "comm/mpi_backend.h"

#include <cstdlib>

#include "tandem/error.h"
#include "tandem_version_config.h"

#if TANDEM_BUILT_WITH_MPI
#include <algorithm>
#include <climits>
#include <cstring>
#include <condition_variable>
#include <mutex>

#include <ATen/ATen.h>
#include <mpi.h>

#include "comm/mpi_engine.h"
#endif

namespace tandem::comm::detail {

bool started_by_mpi_launcher(std::string* how) {
  // mpirun / orterun set OMPI_COMM_WORLD_*; srun --mpi=pmix and prterun set PMIX_RANK; srun
  // --mpi=pmi2 sets PMI_RANK. Without one, MPI_Init makes a world of one (a "singleton").
  for (const char* variable : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (const char* value = std::getenv(variable); value && *value) {
      if (how) *how = variable;
      return true;
    }
  }
  return false;
}

#if !TANDEM_BUILT_WITH_MPI
bool mpi_built() { return false; }

std::string mpi_library_version() { return "none (built without Open MPI's development files: libopenmpi-dev)"; }

c10::intrusive_ptr<c10d::Backend> make_mpi_backend(int, int, std::chrono::milliseconds) {
  throw Error("this build of Tandem has no MPI backend: install Open MPI's development files "
              "(Debian: libopenmpi-dev; scripts/setup installs it) and rebuild, or use TANDEM_CPU_BACKEND=gloo");
}

c10::intrusive_ptr<c10d::Backend> split_mpi_backend(const c10::intrusive_ptr<c10d::Backend>&, int, int, int) {
  throw Error("this build of Tandem has no MPI backend");
}
#else
namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

void check(int code, const char* call) {
  if (code != MPI_SUCCESS) throw Error(std::string(call) + " failed: " + mpi_error_text(code));
}

// Half and BFloat16 have no MPI type: they travel as 16-bit words and reduce with our own ops,
// each element through float and rounded back, as c10's arithmetic (and Gloo) does.
enum class Combine { Sum, Product, Min, Max };

template <typename T, Combine C>
void combine16(void* in, void* inout, int* length, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r = 0;
    if constexpr (C == Combine::Sum) r = x + y;
    if constexpr (C == Combine::Product) r = x * y;
    if constexpr (C == Combine::Min) r = std::min(x, y);
    if constexpr (C == Combine::Max) r = std::max(x, y);
    b[i] = static_cast<T>(r);
  }
}

Combine combine_of(c10d::ReduceOp op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return Combine::Sum;
    case c10d::ReduceOp::PRODUCT: return Combine::Product;
    case c10d::ReduceOp::MIN: return Combine::Min;
    case c10d::ReduceOp::MAX: return Combine::Max;
    default:
      // AVG never reaches a CPU backend: ProcessGroup sums and divides (as it does on Gloo).
      throw Error("the MPI backend reduces with sum, product, min or max");
  }
}

// The 16-bit ops, made once, on the engine thread (the only one that calls MPI).
template <typename T>
MPI_Op op16(Combine c) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op& op = ops[static_cast<int>(c)];
  if (op == MPI_OP_NULL) {
    MPI_User_function* fn = c == Combine::Sum       ? &combine16<T, Combine::Sum>
                            : c == Combine::Product ? &combine16<T, Combine::Product>
                            : c == Combine::Min     ? &combine16<T, Combine::Min>
                                                    : &combine16<T, Combine::Max>;
    check(MPI_Op_create(fn, /*commute=*/1, &op), "MPI_Op_create");
  }
  return op;
}

struct Reduction {
  MPI_Datatype type;
  MPI_Op op;
};

Reduction reduction_for(at::ScalarType dtype, c10d::ReduceOp reduce) {
  const Combine c = combine_of(reduce);
  const MPI_Op standard = c == Combine::Sum ? MPI_SUM : c == Combine::Product ? MPI_PROD : c == Combine::Min ? MPI_MIN : MPI_MAX;
  switch (dtype) {
    case at::kFloat: return {MPI_FLOAT, standard};
    case at::kDouble: return {MPI_DOUBLE, standard};
    case at::kLong: return {MPI_INT64_T, standard};
    case at::kInt: return {MPI_INT32_T, standard};
    case at::kShort: return {MPI_INT16_T, standard};
    case at::kChar: return {MPI_INT8_T, standard};
    case at::kByte: return {MPI_UINT8_T, standard};
    case at::kBool:  // sum and max: any rank's true; product and min: every rank's
      return {MPI_C_BOOL, c == Combine::Sum || c == Combine::Max ? MPI_LOR : MPI_LAND};
    case at::kHalf: return {MPI_UINT16_T, op16<c10::Half>(c)};
    case at::kBFloat16: return {MPI_UINT16_T, op16<c10::BFloat16>(c)};
    default:
      throw Error(std::string("the MPI backend cannot reduce ") + c10::toString(dtype) + " tensors");
  }
}

// MPI counts are int: larger buffers go in pieces.
constexpr int64_t kMaxPiece = INT_MAX / 16;
// How often a waiter looks whether the engine got stuck on an earlier call.
constexpr std::chrono::milliseconds kStuckCheck{100};

class MpiWork : public c10d::Work {
 public:
  /// `in_engine`: the call runs on the engine's thread (a collective), so a timeout leaves the
  /// engine stuck in it; a p2p request only waits in the engine's poll list, and is not.
  MpiWork(int rank, c10d::OpType type, std::string what, std::chrono::milliseconds default_timeout,
          bool in_engine = true)
      : c10d::Work(rank, type), what_(std::move(what)), default_timeout_(default_timeout), in_engine_(in_engine) {}

  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> hold(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    done_signal_.notify_all();
  }

  bool isCompleted() override {
    std::lock_guard<std::mutex> hold(mutex_);
    return done_;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> hold(mutex_);
    return done_ && !error_;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> hold(mutex_);
    return error_;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout == kNoTimeout) timeout = default_timeout_;
    MpiEngine& engine = MpiEngine::instance();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock<std::mutex> lock(mutex_);
    // In slices: a call queued behind one that timed out will never run, and must say so at once
    // instead of costing every bucket another full timeout.
    while (!done_) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        const std::string why = "MPI " + what_ + " timed out after " + std::to_string(timeout.count()) + " ms";
        if (!in_engine_) throw Error(why);
        engine.mark_stuck(why + " and never returned (MPI cannot cancel a collective: exit non-zero and mpirun ends the job)");
        throw Error(why);
      }
      done_signal_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(deadline - now, kStuckCheck));
      if (!done_) {
        lock.unlock();
        std::string stuck = engine.stuck();
        lock.lock();
        if (!stuck.empty() && !done_) throw Error("MPI " + what_ + " cannot run: " + stuck);
      }
    }
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  const std::string what_;
  const std::chrono::milliseconds default_timeout_;
  const bool in_engine_;
  mutable std::mutex mutex_;
  std::condition_variable done_signal_;
  bool done_ = false;
  std::exception_ptr error_;
};

class MpiBackend : public c10d::Backend {
 public:
  MpiBackend(int rank, int size, std::chrono::milliseconds timeout, MPI_Comm comm)
      : c10d::Backend(rank, size), timeout_(timeout), comm_(comm) {}

  ~MpiBackend() override {
    try {
      MpiEngine::instance().submit([comm = comm_]() mutable { MPI_Comm_free(&comm); });
    } catch (...) {
      // Stuck or finalized: the communicator goes with the process.
    }
  }

  const std::string getBackendName() const override { return "mpi"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    at::Tensor t = single_cpu_tensor(tensors, "all_reduce");
    const c10d::ReduceOp reduce = opts.reduceOp;
    return enqueue(c10d::OpType::ALLREDUCE, "all_reduce", [t, reduce, comm = comm_] {
      const Reduction r = reduction_for(t.scalar_type(), reduce);
      char* data = static_cast<char*>(t.data_ptr());
      const int64_t n = t.numel(), item = t.element_size();
      for (int64_t at = 0; at < n; at += kMaxPiece) {
        const int count = static_cast<int>(std::min(kMaxPiece, n - at));
        check(MPI_Allreduce(MPI_IN_PLACE, data + at * item, count, r.type, r.op, comm), "MPI_Allreduce");
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    at::Tensor t = single_cpu_tensor(tensors, "broadcast");
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(c10d::OpType::BROADCAST, "broadcast", [t, root, comm = comm_] {
      char* data = static_cast<char*>(t.data_ptr());
      const int64_t bytes = t.nbytes();
      for (int64_t at = 0; at < bytes; at += kMaxPiece) {
        const int count = static_cast<int>(std::min(kMaxPiece, bytes - at));
        check(MPI_Bcast(data + at, count, MPI_BYTE, root, comm), "MPI_Bcast");
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    at::Tensor in = single_cpu_tensor(inputs, "all_gather");
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(getSize())) {
      throw Error("the MPI backend's all_gather needs one output list with a tensor per rank");
    }
    if (in.nbytes() > static_cast<size_t>(kMaxPiece)) {
      throw Error("the MPI backend gathers at most " + std::to_string(kMaxPiece) + " bytes per rank");
    }
    std::vector<at::Tensor> out = outputs[0];
    for (const auto& o : out) {
      if (!o.defined() || !o.device().is_cpu() || !o.is_contiguous() || o.nbytes() != in.nbytes()) {
        throw Error("the MPI backend's all_gather needs contiguous CPU outputs of the input's size");
      }
    }
    return enqueue(c10d::OpType::ALLGATHER, "all_gather", [in, out, comm = comm_] {
      const int bytes = static_cast<int>(in.nbytes());
      if (bytes == 0) return;  // nothing to move (and no buffer to point at)
      at::Tensor flat = at::empty({static_cast<int64_t>(out.size()) * bytes}, at::kByte);
      check(MPI_Allgather(in.data_ptr(), bytes, MPI_BYTE, flat.data_ptr(), bytes, MPI_BYTE, comm), "MPI_Allgather");
      for (size_t r = 0; r < out.size(); ++r) {
        std::memcpy(out[r].data_ptr(), flat.data_ptr<uint8_t>() + r * static_cast<size_t>(bytes), static_cast<size_t>(bytes));
      }
    });
  }

  // Note [Flat collectives] in process_group.cpp: MPI's own reduce-scatter and all-gather.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    at::Tensor in = flat_cpu_tensor(input, "reduce_scatter"), out = flat_cpu_tensor(output, "reduce_scatter");
    const c10d::ReduceOp reduce = opts.reduceOp;
    const int64_t shard = out.numel();
    if (shard > kMaxPiece || in.numel() > INT_MAX) {
      throw Error("the MPI backend reduce-scatters at most " + std::to_string(kMaxPiece) + " elements per rank and " +
                  std::to_string(INT_MAX) + " in all");
    }
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter", [in, out, reduce, shard, comm = comm_] {
      if (shard == 0) return;
      const Reduction r = reduction_for(in.scalar_type(), reduce);
      check(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(shard), r.type, r.op, comm),
            "MPI_Reduce_scatter_block");
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    at::Tensor in = flat_cpu_tensor(input, "all_gather_into"), out = flat_cpu_tensor(output, "all_gather_into");
    if (in.nbytes() > static_cast<size_t>(kMaxPiece)) {
      throw Error("the MPI backend gathers at most " + std::to_string(kMaxPiece) + " bytes per rank");
    }
    return enqueue(c10d::OpType::_ALLGATHER_BASE, "all_gather_into", [in, out, comm = comm_] {
      const int bytes = static_cast<int>(in.nbytes());
      if (bytes == 0) return;
      check(MPI_Allgather(in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes, MPI_BYTE, comm), "MPI_Allgather");
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue(c10d::OpType::BARRIER, "barrier", [comm = comm_] { check(MPI_Barrier(comm), "MPI_Barrier"); });
  }

  // Point-to-point: the engine posts MPI_Isend / MPI_Irecv in issue order and then polls the
  // request between its other tasks (MpiEngine::poll), so a pending receive never holds up the
  // collectives queued after it, and a batch of sends and receives cannot deadlock.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return post_p2p(tensors, dst, tag, /*sending=*/true);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return post_p2p(tensors, src, tag, /*sending=*/false);
  }

  /// MPI_Comm_split of this backend's communicator (collective over it): nullptr for color < 0.
  c10::intrusive_ptr<c10d::Backend> split(int color, int rank, int size) {
    MPI_Comm sub = MPI_COMM_NULL;
    int sub_rank = -1, sub_size = 0;
    MpiEngine::instance().run([&, comm = comm_] {
      check(MPI_Comm_split(comm, color < 0 ? MPI_UNDEFINED : color, getRank(), &sub), "MPI_Comm_split");
      if (sub == MPI_COMM_NULL) return;
      MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
      MPI_Comm_rank(sub, &sub_rank);
      MPI_Comm_size(sub, &sub_size);
    });
    if (color < 0) return {};
    if (sub_rank != rank || sub_size != size) {
      MpiEngine::instance().submit([sub]() mutable { MPI_Comm_free(&sub); });
      throw Error("MPI_Comm_split placed this process at rank " + std::to_string(sub_rank) + " of " +
                  std::to_string(sub_size) + ", the subgroup at rank " + std::to_string(rank) + " of " +
                  std::to_string(size));
    }
    return c10::make_intrusive<MpiBackend>(rank, size, timeout_, sub);
  }

 private:
  static at::Tensor flat_cpu_tensor(const at::Tensor& t, const char* op) {
    if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) {
      throw Error(std::string("the MPI backend's ") + op + " takes contiguous CPU tensors");
    }
    return t;
  }

  static at::Tensor single_cpu_tensor(const std::vector<at::Tensor>& tensors, const char* op) {
    if (tensors.size() != 1 || !tensors[0].defined() || !tensors[0].device().is_cpu() || !tensors[0].is_contiguous()) {
      throw Error(std::string("the MPI backend's ") + op + " takes one contiguous CPU tensor");
    }
    return tensors[0];
  }

  c10::intrusive_ptr<c10d::Work> post_p2p(std::vector<at::Tensor>& tensors, int peer, int tag, bool sending) {
    at::Tensor t = single_cpu_tensor(tensors, sending ? "send" : "recv");
    if (t.nbytes() > static_cast<size_t>(INT_MAX)) {
      throw Error("the MPI backend sends at most " + std::to_string(INT_MAX) + " bytes in one message");
    }
    const char* what = sending ? "send" : "recv";
    auto work = c10::make_intrusive<MpiWork>(getRank(), sending ? c10d::OpType::SEND : c10d::OpType::RECV, what,
                                             timeout_, /*in_engine=*/false);
    // A failed post or test ends the work with MPI's reason.
    auto failed = [work, sending](int code) {
      work->finish(std::make_exception_ptr(
          Error(std::string(sending ? "MPI_Isend" : "MPI_Irecv") + " failed: " + mpi_error_text(code))));
    };
    MpiEngine::instance().submit([work, failed, t, peer, tag, sending, comm = comm_]() mutable {
      auto request = std::make_shared<MPI_Request>(MPI_REQUEST_NULL);
      const int bytes = static_cast<int>(t.nbytes());
      const int code = sending ? MPI_Isend(t.data_ptr(), bytes, MPI_BYTE, peer, tag, comm, request.get())
                               : MPI_Irecv(t.data_ptr(), bytes, MPI_BYTE, peer, tag, comm, request.get());
      if (code != MPI_SUCCESS) return failed(code);
      // The tensor stays captured until the request completes: MPI owns its bytes until then. It
      // is let go before the work is finished, so that once wait() returns the engine holds no
      // reference to it (the caller's memory is freed when the caller lets go, not when the engine
      // thread gets round to destroying this task).
      MpiEngine::instance().poll([work, failed, t = std::move(t), request]() mutable {
        int done = 0;
        MPI_Status status;
        const int code = MPI_Test(request.get(), &done, &status);
        if (code != MPI_SUCCESS) {
          t = at::Tensor();
          failed(code);
          return true;
        }
        if (done) {
          t = at::Tensor();
          work->finish(nullptr);
        }
        return done != 0;
      });
    });
    return work;
  }

  template <typename Call>
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* what, Call call) {
    auto work = c10::make_intrusive<MpiWork>(getRank(), type, what, timeout_);
    MpiEngine::instance().submit([work, call]() {
      try {
        call();
        work->finish(nullptr);
      } catch (...) {
        work->finish(std::current_exception());
      }
    });
    return work;
  }

  const std::chrono::milliseconds timeout_;
  const MPI_Comm comm_;
};

}  // namespace

bool mpi_built() { return true; }

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);  // allowed before MPI_Init
  std::string version(text, static_cast<size_t>(length));
  return version.substr(0, version.find_first_of("\r\n"));
}

c10::intrusive_ptr<c10d::Backend> split_mpi_backend(const c10::intrusive_ptr<c10d::Backend>& parent, int color,
                                                    int rank, int size) {
  auto* mpi = dynamic_cast<MpiBackend*>(parent.get());
  if (!mpi) throw Error("split_mpi_backend: the parent group's CPU backend is not MPI");
  return mpi->split(color, rank, size);
}

c10::intrusive_ptr<c10d::Backend> make_mpi_backend(int rank, int size, std::chrono::milliseconds timeout) {
  if (!started_by_mpi_launcher()) {
    throw Error("the MPI backend needs processes started by an MPI launcher (`tandem run --backend mpi`, "
                "mpirun, or srun --mpi=pmix): none of OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_RANK is set");
  }
  MpiEngine& engine = MpiEngine::instance();
  MPI_Comm comm = MPI_COMM_NULL;
  int mpi_rank = -1, mpi_size = 0;
  engine.run([&] {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);  // errors come back as codes, not aborts
    MPI_Comm_rank(comm, &mpi_rank);
    MPI_Comm_size(comm, &mpi_size);
  });
  if (mpi_rank != rank || mpi_size != size) {
    engine.submit([comm]() mutable { MPI_Comm_free(&comm); });
    throw Error("MPI places this process at rank " + std::to_string(mpi_rank) + " of " + std::to_string(mpi_size) +
                ", Tandem's world at rank " + std::to_string(rank) + " of " + std::to_string(size) +
                ": start every rank with one MPI launcher (mpirun -np N, or `tandem run --backend mpi`)");
  }
  return c10::make_intrusive<MpiBackend>(rank, size, timeout, comm);
}
#endif

}  // namespace tandem::comm::detail

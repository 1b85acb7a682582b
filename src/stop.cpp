// NOTE [ stopping a kernel ] in stop.hpp.
#include "stop.hpp"

#include <pthread.h>

#include <condition_variable>
#include <mutex>
#include <stdexcept>

#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace memplan {

namespace {
constexpr auto kPollEvery = std::chrono::milliseconds(20);
}

Stop::Stop(double seconds, bool poll_signals) : poll_signals_(poll_signals) {
  auto now = Clock::now();
  if (seconds >= 0) {
    has_deadline_ = true;
    // Beyond a century the limit changes nothing (and would overflow the clock's range).
    double capped = seconds < 3.0e9 ? seconds : 3.0e9;
    deadline_ = now + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(capped));
  }
  next_poll_ = now + kPollEvery;
}

bool Stop::due() {
  if (flag_.load(std::memory_order_relaxed)) return true;
  if (!has_deadline_ && !poll_signals_) return false;
  auto now = Clock::now();
  if (has_deadline_ && now >= deadline_) {
    timed_out_ = true;
    request();
    return true;
  }
  if (poll_signals_ && now >= next_poll_) {
    next_poll_ = now + kPollEvery;
    if (poll_signal()) return true;
  }
  return false;
}

bool Stop::poll_signal() {
  nb::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) {
    // The KeyboardInterrupt (or whatever the handler raised) stays set in this thread's state
    // until raise_if_interrupted() throws it.
    interrupted_.store(true);
    request();
    return true;
  }
  return false;
}

void Stop::raise_if_interrupted() const {
  if (interrupted_.load()) {
    if (PyErr_Occurred() == nullptr) PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw nb::python_error();
  }
}

namespace {
struct Job {
  const std::function<void()>* work;
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr error;
};

void* job_main(void* arg) {
  auto* job = static_cast<Job*>(arg);
  try {
    (*job->work)();
  } catch (...) {
    job->error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(job->mutex);
    job->done = true;
  }
  job->done_cv.notify_all();
  return nullptr;
}
}  // namespace

void run_on_thread(const std::function<void()>& work, std::size_t stack_bytes, Stop& stop) {
  Job job;
  job.work = &work;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, stack_bytes);
  pthread_t thread;
  int failed = pthread_create(&thread, &attr, job_main, &job);
  pthread_attr_destroy(&attr);
  if (failed != 0) throw std::runtime_error("memplan._core: could not start a worker thread");
  {
    std::unique_lock<std::mutex> lock(job.mutex);
    while (!job.done) {
      if (job.done_cv.wait_for(lock, kPollEvery, [&] { return job.done; })) break;
      lock.unlock();
      if (!stop.requested()) stop.poll_signal();
      lock.lock();
    }
  }
  pthread_join(thread, nullptr);
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace memplan

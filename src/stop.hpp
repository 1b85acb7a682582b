// Stopping a kernel: a time limit, and Ctrl-C while the kernel runs without the GIL.
//
// NOTE [ stopping a kernel ]
// Every kernel releases the GIL while it works and calls Stop::due() in its loops (every row of a
// DP table, every 256 nodes of the compiled search, every node of the skyline search, whose nodes
// can take milliseconds). due() is true once the stop flag is set: by the time limit (a steady
// clock, checked there), or by a SIGINT. Python's C-level handler only records a
// SIGINT; the KeyboardInterrupt is raised when the main thread next runs PyErr_CheckSignals().
// A kernel running in the calling thread does so itself from due(), at most every 20 ms, taking
// the GIL for that moment (Stop::Mode::poll_signals); a kernel running on its own thread (the
// allocation search, for its deep recursion) is watched by the calling thread, which waits for
// it and polls the signals every 20 ms (run_on_thread). Either way the kernel returns within a
// row or 256 nodes, and the pending KeyboardInterrupt is raised once it has returned
// (Stop::raise_if_interrupted), so that the command line exits 130 with nothing written.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>

namespace memplan {

class Stop {
 public:
  using Clock = std::chrono::steady_clock;

  // ``seconds`` < 0: no time limit. ``poll_signals``: due() polls for SIGINT itself (a kernel
  // running in the calling thread, the GIL released).
  Stop(double seconds, bool poll_signals);

  // True once the kernel must stop (time limit, SIGINT, or request()).
  bool due();
  void request() { flag_.store(true, std::memory_order_relaxed); }
  bool requested() const { return flag_.load(std::memory_order_relaxed); }
  bool timed_out() const { return timed_out_; }
  bool interrupted() const { return interrupted_.load(); }
  // Poll SIGINT now (takes the GIL for a moment); true if a KeyboardInterrupt is pending.
  bool poll_signal();
  // With the GIL held, after the kernel: raise the pending KeyboardInterrupt, if any.
  void raise_if_interrupted() const;

 private:
  std::atomic<bool> flag_{false};
  std::atomic<bool> interrupted_{false};
  bool timed_out_ = false;
  bool has_deadline_ = false;
  bool poll_signals_ = false;
  Clock::time_point deadline_{};
  Clock::time_point next_poll_{};
};

// Run ``work`` on a new thread with a ``stack_bytes`` stack while the calling thread (the GIL
// released by the caller) waits, polling SIGINT every 20 ms: a SIGINT sets ``stop``.
void run_on_thread(const std::function<void()>& work, std::size_t stack_bytes, Stop& stop);

}  // namespace memplan

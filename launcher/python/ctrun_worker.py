"""ctrun's helper for Python workers: report training steps and results to the agent.

ctrun puts this module first on the workers' PYTHONPATH when it gives them heartbeat files
(with --worker_timeout, --faults or --fault_report), so a script imports it without installing
anything:

    import ctrun_worker
    for step in range(start, steps):
        train_one_step()
        ctrun_worker.report_step(step + 1)   # a beat, the step for plans "at_step", and the
                                             # point where a planned exception is raised
    ctrun_worker.write_result(digest)        # --fault_report quotes it by rank

Without ctrun (or without those options) every function does nothing, so a script that imports
it runs unchanged elsewhere: guard the import with try/except ImportError if it must also run
where ctrun is absent.

Under `ctrun --fault_tolerance=step` it also gives a script per-step fault tolerance: a
FaultTolerance manager over the model and optimizer, and a StepSampler that trains each sample of
an epoch exactly once whatever the membership does (docs/fault_tolerance.md, "Python scripts"):

    sampler = ctrun_worker.StepSampler(len(dataset), batch_per_replica=32, seed=0)
    ft = ctrun_worker.FaultTolerance(model, optimizer, sampler)
    while True:
        if sampler.epoch_done():               # before the step: a healed replica takes the
            if sampler.epoch + 1 == epochs:    # sampler its peer has at this point
                break
            sampler.set_epoch(sampler.epoch + 1)
        step = ft.begin_step()                 # the step's quorum: its rank and size
        if step.finished:                      # the others finished while this one started
            break
        batch = dataset[sampler.step(step.rank, step.size)]
        loss_fn(model(batch)).backward()
        if ft.should_commit():                 # the gradients averaged over the quorum
            optimizer.step()
        optimizer.zero_grad()
    ft.finish()
"""
import json
import os
import subprocess
import sys
import threading
import time

__all__ = ["FaultTolerance", "InjectedFault", "StepSampler", "report_step", "write_result"]


class InjectedFault(RuntimeError):
    """Raised by report_step() where a ctrun --faults plan injects an exception."""


def _make_cuda_error(message):
    """A CUDA error, as a GPU fault gives one: a kernel that indexes out of bounds on this
    worker's current device (a device-side assert). The context stays broken: every later CUDA
    call in the process fails too, NCCL's included. Raises what torch raises for it."""
    try:
        import torch
    except ImportError:
        raise InjectedFault(message + ": no CUDA device in this worker (torch is not "
                            "installed); raised as an exception instead") from None
    if not torch.cuda.is_available():
        raise InjectedFault(message + ": no CUDA device in this worker "
                            "(torch.cuda.is_available() is False); raised as an exception instead")
    device = torch.cuda.current_device()
    print(f"{message}: launching a kernel that fails on cuda:{device} "
          "(an index out of bounds: a device-side assert)", file=sys.stderr, flush=True)
    values = torch.zeros(1, device=device)
    values[torch.ones(1, dtype=torch.long, device=device)]
    torch.cuda.synchronize(device)
    raise InjectedFault(f"{message}: the failing kernel did not fail on cuda:{device}")


def report_step(step):
    """The worker finished training step `step` (its own count, from 1; a resumed run goes on
    from its checkpoint's step). Where the plan says so, raises InjectedFault, or makes a CUDA
    error (kind cuda_error: torch raises it), before the step is reported: the step that
    raised is not counted as done. Once a script calls it, its count is the worker's: the
    optimizer steps ctrun counts by itself (see _Steps) are no longer written."""
    _steps.explicit = True
    _report(step)


def _report(step):
    fault_file = os.environ.get("CTRUN_FAULT_FILE")
    if fault_file and os.path.exists(fault_file):
        # The agent's file: the kind on the first line, the message on the second.
        with open(fault_file) as f:
            text = f.read().strip()
        kind, _, message = text.partition("\n")
        if kind not in ("exception", "cuda_error"):
            kind, message = "exception", text  # a message alone (agents before cuda_error)
        message = message.strip() or "ctrun: injected " + kind
        if kind == "cuda_error":
            _make_cuda_error(message)
        raise InjectedFault(message)
    path = os.environ.get("CTRUN_HEARTBEAT_FILE")
    if path:
        try:
            # The agent created the file: open without creating, so that a beat after the
            # agent removed its directory does not make one.
            fd = os.open(path, os.O_WRONLY)
        except OSError:
            return
        try:
            # The step, then (once measured) the nanoseconds this worker has waited for its
            # peers in the step's collectives so far: the agent tells its own time from it.
            # Written over the last record at a fixed width, never truncated: a truncated and
            # rewritten file costs ext4 a flush at close (~150 us a step here).
            wait = _steps.wait_ns
            text = f"{int(step)} {int(wait)}" if wait is not None else f"{int(step)}"
            os.pwrite(fd, (text.ljust(_RECORD_WIDTH) + "\n").encode(), 0)
        finally:
            os.close(fd)


# A heartbeat record's width before its newline (two 20-digit numbers and a space fit).
_RECORD_WIDTH = 41


class _Steps:
    """The worker's steps seen without a code change (docs/env.md, "Steps"): ctrun's
    sitecustomize.py calls patch() as torch's autograd, optimizer and DDP modules load, and every
    step of the first optimizer that steps is one training step (so gradient accumulation counts
    optimizer steps), written to the heartbeat file as report_step() writes it, until the script
    calls report_step() itself: its own count wins from then on.

    It also measures what a straggler verdict needs in a synchronous job, where every rank's
    steps take the slowest's time: how long this rank waits for its peers. DDP waits for its
    gradients' all-reduces at the end of the backward pass, so a backward's time is the rank's
    own gradient computation plus that wait; DDP's reducer times the computation (torch's DDP
    logging data, the last iteration's, sampled), and the rest of the backward is the wait."""

    # The DDP logging data costs 5-75 us to read (torch 1.13, one CPU core): read on a step with
    # the chance that makes one reading about every this often. By chance, not every Nth step:
    # steps that alternate (a peer stopped every other step) would always give the same half.
    SAMPLE_EVERY_S = 0.05
    # On a CUDA module DDP's timer waits for its events: fewer sampled iterations there.
    CUDA_SAMPLE_RATE = 10

    def __init__(self):
        self.explicit = False  # the script calls report_step()
        self.count = 0
        self.wait_ns = None  # the waits measured so far; None before the first
        self._optimizer = None  # a weak reference to the optimizer counted
        self._models = []  # weak references to the DDP modules made
        self._backward_s = 0.0  # the backward passes' time since the last step, and how many
        self._backwards = 0
        self._compute_s = None  # a DDP backward's own computation, as last sampled
        self._stepped_at = None
        self._step_seconds = None  # the steps' average time, smoothed
        self._random = None
        self._inside = 0

    def patch(self, name, module):
        try:
            if name == "torch.optim.optimizer":
                self._patch_optimizer(module)
            elif name == "torch.nn.parallel.distributed":
                self._patch_ddp(module)
            elif name == "torch.autograd":
                self._patch_backward(module)
        except Exception as e:  # never stop a script for ctrun's sake
            print(f"[ctrun] steps are not counted by themselves ({type(e).__name__}: {e}); "
                  "ctrun_worker.report_step(step) still reports them", file=sys.stderr,
                  flush=True)

    def _patch_optimizer(self, module):
        register = getattr(module, "register_optimizer_step_post_hook", None)
        if register is not None:  # torch 2.x: a hook for every optimizer's step
            register(lambda optimizer, args, kwargs: self.stepped(optimizer))
            return
        # torch 1.13: each optimizer class's step wrapped once, as its first instance is made.
        optimizer_class = module.Optimizer
        init = optimizer_class.__init__
        steps = self

        def counting_init(optimizer, *args, **kwargs):
            init(optimizer, *args, **kwargs)
            steps._wrap_step(type(optimizer))

        optimizer_class.__init__ = counting_init

    def _wrap_step(self, cls):
        if cls.__dict__.get("_ctrun_counted"):
            return
        step = cls.step
        steps = self

        def counted_step(optimizer, *args, **kwargs):
            # A subclass's step that calls its base's is one step.
            steps._inside += 1
            try:
                out = step(optimizer, *args, **kwargs)
            finally:
                steps._inside -= 1
            if steps._inside == 0:
                steps.stepped(optimizer)
            return out

        counted_step.__wrapped__ = step
        counted_step.__doc__ = step.__doc__
        # torch 1.13's profiler wraps a class's step once, unless the step says it is wrapped.
        counted_step.hooked = getattr(step, "hooked", False)
        cls.step = counted_step
        cls._ctrun_counted = True

    def _patch_ddp(self, module):
        import weakref

        ddp_class = module.DistributedDataParallel
        init = ddp_class.__init__
        steps = self

        def timed_init(model, *args, **kwargs):
            init(model, *args, **kwargs)
            try:
                cuda = any(p.is_cuda for p in model.parameters())
                model._set_ddp_runtime_logging_sample_rate(steps.CUDA_SAMPLE_RATE if cuda else 1)
                steps._models.append(weakref.ref(model))
            except Exception:
                pass  # a DDP without the logging data: its waits are not measured

        ddp_class.__init__ = timed_init

    def _patch_backward(self, module):
        # Tensor.backward() calls torch.autograd.backward() by name, so both are timed.
        backward = module.backward
        steps = self

        def timed_backward(*args, **kwargs):
            began = time.perf_counter()
            try:
                return backward(*args, **kwargs)
            finally:
                steps._backward_s += time.perf_counter() - began
                steps._backwards += 1

        timed_backward.__wrapped__ = backward
        timed_backward.__doc__ = backward.__doc__
        module.backward = timed_backward

    def stepped(self, optimizer):
        import weakref

        counted = self._optimizer() if self._optimizer is not None else None
        if counted is None:
            self._optimizer = weakref.ref(optimizer)
        elif counted is not optimizer:
            return  # the first optimizer's steps are the worker's
        backward_s, backwards = self._backward_s, self._backwards
        self._backward_s, self._backwards = 0.0, 0
        self._sample_compute()
        if self._compute_s is not None and backwards:
            waited = max(0.0, backward_s - backwards * self._compute_s)
            self.wait_ns = (self.wait_ns or 0) + int(waited * 1e9)
        if self.explicit:
            return  # the script reports its own steps (with these waits)
        self.count += 1
        _report(self.count)

    def _sample_compute(self):
        now = time.monotonic()
        if self._stepped_at is not None:
            took = now - self._stepped_at
            self._step_seconds = took if self._step_seconds is None else \
                0.9 * self._step_seconds + 0.1 * took
        self._stepped_at = now
        if self._compute_s is not None and self._step_seconds is not None and \
                self._step_seconds < self.SAMPLE_EVERY_S:
            if self._random is None:
                import random

                self._random = random.Random()
            if self._random.random() > self._step_seconds / self.SAMPLE_EVERY_S:
                return
        model = None
        for ref in self._models:
            model = ref()
            if model is not None:
                break
        if model is None:
            return
        try:
            compute = model._get_ddp_logging_data().get("backward_compute_time")
        except Exception:
            return
        if isinstance(compute, int) and compute > 0:
            self._compute_s = compute / 1e9


_steps = _Steps()


def write_result(text):
    """What identifies this worker's result (a digest of its parameters, a metric): with
    --fault_report the agent lists it by rank, so a CI job compares a faulted run with a clean
    one. One line; written once, at the end."""
    path = os.environ.get("CTRUN_RESULT_FILE")
    if path:
        with open(path, "w") as f:
            f.write(str(text).splitlines()[0] if str(text) else "")
            f.write("\n")


class StepSampler:
    """The sampler of per-step fault tolerance: exact, not lossy. An epoch's order is torch's
    DistributedSampler's (torch.randperm seeded with seed + epoch, or 0..n-1 without shuffle);
    each step trains the next `batch_per_replica * size` samples of it, split among the quorum's
    `size` replicas strided by rank. A step that does not commit is trained again from the same
    place by the next quorum, with shares for its size; a healed replica takes its peer's place.
    So each sample of an epoch is trained exactly once, whatever the membership does. The
    epoch's last step is short."""

    def __init__(self, dataset_size, batch_per_replica, shuffle=True, seed=0):
        if int(dataset_size) <= 0:
            raise ValueError("StepSampler: the dataset is empty")
        if int(batch_per_replica) <= 0:
            raise ValueError("StepSampler: batch_per_replica must be positive, got %r"
                             % (batch_per_replica,))
        self.dataset_size = int(dataset_size)
        self.batch_per_replica = int(batch_per_replica)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.committed = 0
        self._order = None

    def _epoch_order(self, epoch):
        if not self.shuffle:
            return list(range(self.dataset_size))
        import torch
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def set_epoch(self, epoch):
        self.restore(epoch, 0)

    def restore(self, epoch, committed):
        """Takes the place a peer (healing) or a checkpoint had: `committed` samples of `epoch`
        done."""
        if self._order is None or int(epoch) != self.epoch:
            self._order = self._epoch_order(int(epoch))
        self.epoch = int(epoch)
        self.committed = min(int(committed), self.dataset_size)

    def state_dict(self):
        return {"epoch": self.epoch, "committed": self.committed}

    def load_state_dict(self, state):
        self.restore(state["epoch"], state["committed"])

    def step_size(self, size):
        """How many samples a quorum of `size` trains in the next step."""
        if int(size) < 1:
            raise ValueError("StepSampler: a quorum of no replicas")
        return min(self.batch_per_replica * int(size), self.dataset_size - self.committed)

    def epoch_done(self, size=1):
        return self.step_size(size) == 0

    def step(self, rank, size):
        """The samples replica `rank` of a quorum of `size` trains in the next step (fewer, or
        none, in the epoch's short last step)."""
        if not 0 <= int(rank) < int(size):
            raise ValueError("StepSampler: rank %d is outside a quorum of %d" % (rank, size))
        if self._order is None:
            self._order = self._epoch_order(self.epoch)
        start = self.committed
        return [self._order[start + k] for k in range(int(rank), self.step_size(size), int(size))]

    def commit(self, size):
        """The quorum of `size` committed the step: its samples are done."""
        self.committed += self.step_size(size)


class _ProxyError(RuntimeError):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class _Proxy:
    """`ctrun worker-proxy`, this worker's child: the replica's connection to the per-step quorum
    and to the job's store (ctrund's or etcd's), spoken to in JSON lines. It ends with this
    process, and the quorum learns at once that the replica is gone."""

    def __init__(self, executable):
        self._process = subprocess.Popen([executable, "worker-proxy"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, close_fds=True)
        self._lock = threading.Lock()
        self._next_id = 0
        self._waiting = {}
        self._gone = None
        reader = threading.Thread(target=self._read, name="ctrun-proxy-reader", daemon=True)
        reader.start()

    def call(self, op, **fields):
        done = threading.Event()
        slot = [done, None]
        with self._lock:
            if self._gone:
                raise _ProxyError("connection", self._gone)
            self._next_id += 1
            request_id = self._next_id
            self._waiting[request_id] = slot
            line = json.dumps(dict(fields, id=request_id, op=op)) + "\n"
            try:
                self._process.stdin.write(line.encode())
                self._process.stdin.flush()
            except OSError as e:
                del self._waiting[request_id]
                raise _ProxyError("connection", "ctrun worker-proxy is gone: %s" % e) from None
        done.wait()
        reply = slot[1]
        if reply is None:
            raise _ProxyError("connection", self._gone or "ctrun worker-proxy is gone")
        if not reply.get("ok"):
            raise _ProxyError(reply.get("code", "internal"), reply.get("error", "no reason given"))
        return reply

    def _read(self):
        for line in self._process.stdout:
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                slot = self._waiting.pop(reply.get("id"), None)
            if slot is not None:
                slot[1] = reply
                slot[0].set()
        with self._lock:
            self._gone = "ctrun worker-proxy exited (status %s)" % self._process.poll()
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            slot[0].set()

    def close(self):
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()


def _proxy_store_class():
    """torch.distributed.Store over the proxy: where each quorum's process group meets (the job's
    store, so that it outlives any node). Made on first use, so that importing this module
    needs no torch."""
    import torch.distributed as dist

    def as_bytes(value):
        return value.encode() if isinstance(value, str) else bytes(value)

    class ProxyStore(dist.Store):
        def __init__(self, proxy, timeout_s):
            super().__init__()
            self._proxy = proxy
            self._timeout_ms = int(timeout_s * 1000)
            self._clones = []

        def set(self, key, value):
            self._proxy.call("set", key=key, value=as_bytes(value).hex())

        def get(self, key):
            reply = self._proxy.call("get", key=key, timeout_ms=self._timeout_ms)
            return bytes.fromhex(reply["value"])

        def add(self, key, amount):
            return int(self._proxy.call("add", key=key, delta=int(amount))["value"])

        def compare_set(self, key, expected, desired):
            reply = self._proxy.call("compare_set", key=key, expected=as_bytes(expected).hex(),
                                     desired=as_bytes(desired).hex())
            return bytes.fromhex(reply["value"])

        def check(self, keys):
            return bool(self._proxy.call("check", keys=list(keys))["ready"])

        def wait(self, keys, timeout=None):
            ms = self._timeout_ms if timeout is None else int(timeout.total_seconds() * 1000)
            self._proxy.call("wait", keys=list(keys), timeout_ms=ms)

        def delete_key(self, key):
            return bool(self._proxy.call("delete", key=key)["deleted"])

        def num_keys(self):
            return int(self._proxy.call("num_keys")["count"])

        def set_timeout(self, timeout):
            self._timeout_ms = int(timeout.total_seconds() * 1000)

        def clone(self):
            # torch 2.x may ask for a copy (Store::clone). The copy shares the proxy, which is
            # thread-safe; it is kept here because the C++ side would not keep its Python half.
            copy = ProxyStore(self._proxy, self._timeout_ms / 1000)
            self._clones.append(copy)
            return copy

    return ProxyStore


def _log(line):
    print("[ctrun] fault tolerance: " + line, file=sys.stderr, flush=True)


def _beat():
    """Proof of progress for --worker_timeout (the heartbeat file's time) without a step."""
    path = os.environ.get("CTRUN_HEARTBEAT_FILE")
    if path:
        try:
            os.utime(path)
        except OSError:
            pass


class _BackgroundAsker:
    """One thread for the run that asks for the next quorum while a step runs (begin_step()
    in steady state); the answer is awaited before the step's first collective."""

    def __init__(self, ask):
        self._ask = ask
        self._orders = []
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ctrun-quorum-ask", daemon=True)
        self._thread.start()

    def ask(self, committed):
        done, result = threading.Event(), {}
        with self._ready:
            self._orders.append((committed, done, result))
            self._ready.notify()
        return done, result

    def stop(self):
        with self._ready:
            self._orders.append(None)
            self._ready.notify()

    def _run(self):
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._orders)
                order = self._orders.pop(0)
            if order is None:
                return
            committed, done, result = order
            try:
                result["reply"] = self._ask(committed, False)
            except BaseException as e:  # handed to the step
                result["error"] = e
            done.set()


class _GradientBuckets:
    """The gradients averaged during the backward pass, as DDP does: the parameters in
    reverse order (roughly the order backward produces their gradients) in buckets of one
    dtype and device, the first about 1 MB and the others about 25 MB. A parameter's hook copies
    its gradient into its bucket; a full bucket is all-reduced at once, in bucket order on every
    replica (a bucket waits for those before it), so replicas launch the same collectives in the
    same order. The first launch waits for the step's quorum. Buckets left at the end of the
    step (parameters that got no gradient, a replica with no samples) are launched by finish(),
    their missing gradients as zeros."""

    FIRST_BYTES = 1 << 20
    BYTES = 25 << 20

    def __init__(self, ft):
        self._ft = ft
        params = [p for p in ft.model.parameters() if p.requires_grad]
        groups, current, size, kind = [], [], 0, None
        cap = self.FIRST_BYTES
        for p in reversed(params):
            if current and (size >= cap or (p.dtype, p.device) != kind):
                groups.append(current)
                current, size, cap = [], 0, self.BYTES
            current.append(p)
            kind = (p.dtype, p.device)
            size += p.numel() * p.element_size()
        if current:
            groups.append(current)
        self._buckets = []
        for index, group in enumerate(groups):
            offsets, total = [], 0
            for p in group:
                offsets.append(total)
                total += p.numel()
            self._buckets.append({"params": group, "offsets": offsets, "flat": None,
                                  "size": total, "seen": [False] * len(group), "ready": 0,
                                  "work": None})
            for slot, p in enumerate(group):
                p.register_hook(self._hook(index, slot))
        self._next = 0
        self._active = False
        self.accumulated = False

    def _flat(self, bucket):
        if bucket["flat"] is None:
            p = bucket["params"][0]
            bucket["flat"] = self._ft._torch.zeros(bucket["size"], dtype=p.dtype,
                                                   device=self._ft._device)
        return bucket["flat"]

    def begin(self):
        for bucket in self._buckets:
            bucket["seen"] = [False] * len(bucket["params"])
            bucket["ready"] = 0
            bucket["work"] = None
        self._next = 0
        self._active = True
        self.accumulated = False

    def _hook(self, index, slot):
        def on_gradient(grad):
            if not self._active:
                return None  # a backward outside a step: the caller's own
            bucket = self._buckets[index]
            if bucket["seen"][slot]:
                self.accumulated = True  # a second backward in the step
                return None
            bucket["seen"][slot] = True
            offset, n = bucket["offsets"][slot], bucket["params"][slot].numel()
            self._flat(bucket)[offset:offset + n].copy_(grad.reshape(-1))
            bucket["ready"] += 1
            while self._next < len(self._buckets) and \
                    self._buckets[self._next]["ready"] == len(self._buckets[self._next]["params"]):
                self._launch(self._buckets[self._next])
                self._next += 1
            return None
        return on_gradient

    def _launch(self, bucket):
        ft = self._ft
        ft._resolve_answer()
        if ft._skip or ft._lost:
            return
        try:
            bucket["work"] = ft._group.allreduce([bucket["flat"]])
        except RuntimeError as e:
            ft._collective_failed(_first_line(e))

    def finish(self):
        """Waits for the step's buckets and writes the quorum's average into each .grad (raises
        what a failed collective raised). False when the step ran backward more than once: the
        caller averages the whole .grad then."""
        ft = self._ft
        self._active = False
        while self._next < len(self._buckets):
            bucket = self._buckets[self._next]
            flat = self._flat(bucket)
            for slot, p in enumerate(bucket["params"]):
                if not bucket["seen"][slot]:
                    offset = bucket["offsets"][slot]
                    flat[offset:offset + p.numel()].zero_()
            self._launch(bucket)
            self._next += 1
        waited = time.monotonic()
        for bucket in self._buckets:
            if bucket["work"] is not None and not ft._lost:
                bucket["work"].wait()  # raises when a peer failed: the step is lost
        # The straggler verdict's measure: what this replica waited for its peers.
        _steps.wait_ns = (_steps.wait_ns or 0) + int((time.monotonic() - waited) * 1e9)
        if ft._lost:
            return True  # nothing to average: the step is lost
        if self.accumulated:
            return False
        for bucket in self._buckets:
            flat = bucket["flat"]
            flat /= ft._size
            for slot, p in enumerate(bucket["params"]):
                offset = bucket["offsets"][slot]
                average = flat[offset:offset + p.numel()].view_as(p)
                if p.grad is None:
                    p.grad = average.clone()
                else:
                    p.grad.copy_(average)
        return True


def _first_line(error):
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class FaultTolerance:
    """Per-step fault tolerance for a data-parallel script under ctrun --fault_tolerance=step
    (docs/fault_tolerance.md): every step trains on a quorum of the job's replicas and commits
    only when its collectives succeeded, so a failure costs the step it happened in, not a
    restart. Each worker is a replica: it holds the whole model (no torch DDP: the gradients are
    averaged over the quorum by should_commit()).

    begin_step() starts a step: in steady state it asks for the next quorum in the background
    while the step's forward and backward run; the first step, and each after a lost one, waits
    for the quorum, builds the quorum's process group (Gloo, or NCCL on torch 2.x) in the job's
    store, and heals a new or lagging replica from a live one: the model's and the optimizer's
    state, the committed step, the sampler's place and torch's random generator. should_commit()
    averages the gradients over the quorum and says whether the step commits: then the caller
    steps the optimizer; otherwise the gradients are discarded and the next step trains the same
    samples again. Committed parameters are the same on every replica.

    With overlap_gradients (the default) the gradients are averaged during the backward pass, in
    buckets as DDP's (about 1 MB, then 25 MB, in the parameters' reverse order), each launched as
    soon as its gradients are ready; a step that runs backward more than once (gradient
    accumulation) is averaged again whole at should_commit(), correct but not overlapped: pass
    overlap_gradients=False for such loops.

    The timeouts form one hierarchy: collective < join < quorum, heartbeat < quorum (seconds)."""

    class Step:
        __slots__ = ("step", "rank", "size", "finished")

        def __init__(self, step, rank, size, finished=False):
            self.step = step          # the step being trained: committed_step + 1
            self.rank = rank          # this replica's rank in the step's quorum,
            self.size = size          # and its size: the share of the step's samples
            self.finished = finished  # the other replicas finished the training at `step`

        def __repr__(self):
            return "Step(step=%d, rank=%d, size=%d, finished=%s)" % (
                self.step, self.rank, self.size, self.finished)

    def __init__(self, model, optimizer, sampler=None, *, backend="gloo", min_replicas=1,
                 max_replicas=0, collective_timeout=30.0, heartbeat_timeout=5.0,
                 join_timeout=60.0, quorum_timeout=300.0, overlap_quorum=True,
                 overlap_gradients=True, committed_step=0):
        if os.environ.get("CTRUN_FAULT_TOLERANCE") != "step":
            raise RuntimeError("ctrun_worker.FaultTolerance needs a worker started by ctrun "
                               "--fault_tolerance=step (CTRUN_FAULT_TOLERANCE=step)")
        executable = os.environ.get("CTRUN_WORKER_PROXY")
        if not executable:
            raise RuntimeError("ctrun_worker.FaultTolerance: CTRUN_WORKER_PROXY is not set (an "
                               "agent older than this helper); run the job with this ctrun")
        if backend not in ("gloo", "nccl"):
            raise ValueError("FaultTolerance: backend must be 'gloo' or 'nccl', got %r"
                             % (backend,))
        timeouts = {"collective": collective_timeout, "heartbeat": heartbeat_timeout,
                    "join": join_timeout, "quorum": quorum_timeout}
        for name, value in timeouts.items():
            if not value > 0:
                raise ValueError("FaultTolerance: the %s timeout must be positive, got %r"
                                 % (name, value))
        for shorter, longer in (("collective", "join"), ("join", "quorum"),
                                ("heartbeat", "quorum")):
            if timeouts[shorter] >= timeouts[longer]:
                raise ValueError("FaultTolerance: the %s timeout (%gs) must be shorter than the "
                                 "%s timeout (%gs)" % (shorter, timeouts[shorter], longer,
                                                       timeouts[longer]))
        if heartbeat_timeout < 0.1:
            raise ValueError("FaultTolerance: the heartbeat timeout must be at least 0.1 s")
        import torch
        self._torch = torch
        self.model = model
        self.optimizer = optimizer
        self.sampler = sampler
        self._backend = backend
        self._collective_timeout = float(collective_timeout)
        self._quorum_timeout = float(quorum_timeout)
        self._overlap = bool(overlap_quorum)
        self._fatal = None
        self._asks = _BackgroundAsker(self._ask)
        self._buckets = _GradientBuckets(self) if overlap_gradients else None
        if backend == "nccl":
            # A failed peer's communicator is aborted and the wait raises, instead of the
            # watchdog ending this process (torch 2.x).
            os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
            self._device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        else:
            self._device = torch.device("cpu")
        self._committed = int(committed_step)
        self._group = None
        self._prefix = None
        self._members = None
        self._rank = 0
        self._size = 1
        self._last_committed = False
        self._broken = False
        self._step_open = False
        self._lost = False
        self._skip = False
        self._pending = None
        self._changed = None
        self._finished_at = None
        self.stats = {"steps_committed": 0, "steps_lost": 0, "rebuilds": 0,
                      "heals_received": 0, "heals_sent": 0}
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self._proxy = _Proxy(executable)
        self._store = _proxy_store_class()(self._proxy, self._collective_timeout)
        self._proxy.call("connect", timeout_ms=int(quorum_timeout * 1000), config={
            "min_replicas": int(min_replicas),
            "max_replicas": int(max_replicas) if max_replicas else world,
            "join_timeout_ms": int(join_timeout * 1000),
            "heartbeat_timeout_ms": int(heartbeat_timeout * 1000)})

    # -- the step --------------------------------------------------------------------------

    def begin_step(self):
        if self._step_open:
            raise RuntimeError("FaultTolerance: begin_step() twice without should_commit()")
        self._lost = False
        self._skip = False
        if self._buckets is not None:
            self._buckets.begin()
        self._step_open = True
        if self._overlap and self._group is not None and self._last_committed and \
                not self._broken:
            # Steady state: the next quorum is asked for while the step runs, and awaited
            # before its first collective (should_commit()).
            self._pending = self._asks.ask(self._committed)
            return FaultTolerance.Step(self._committed + 1, self._rank, self._size)
        try:
            self._settle()
        except BaseException:
            self._step_open = False
            raise
        if self._finished_at is not None:
            self._step_open = False
            return FaultTolerance.Step(self._finished_at, 0, 1, True)
        return FaultTolerance.Step(self._committed + 1, self._rank, self._size)

    def should_commit(self):
        if not self._step_open:
            raise RuntimeError("FaultTolerance: should_commit() without begin_step()")
        self._step_open = False
        self._resolve_answer()
        if self._fatal is not None:
            fatal, self._fatal = self._fatal, None
            raise fatal
        if not self._skip:
            try:
                if self._buckets is None or not self._buckets.finish():
                    self._average_gradients()
                if self._backend == "nccl":
                    # NCCL's collectives end on the device: one more, waited for on the host,
                    # settles the step's (the C++ runtime's FaultTolerance does the same).
                    closing = self._torch.zeros(1, device=self._device)
                    self._group.allreduce([closing]).wait()
                    self._torch.cuda.current_stream(self._device).synchronize()
            except RuntimeError as e:
                self._collective_failed(_first_line(e))
        if self._lost:
            self.stats["steps_lost"] += 1
            self._last_committed = False
            for p in self.model.parameters():
                p.grad = None
            return False
        self._committed += 1
        self.stats["steps_committed"] += 1
        if self.sampler is not None:
            self.sampler.commit(self._size)
        self._last_committed = True
        report_step(self._committed)  # progress for --worker_timeout, and --faults plans
        return True

    def finish(self):
        """This replica finished the training: the quorum lets it go, and a replacement that
        asks later learns that nothing is left (Step.finished). Call once, at the end."""
        try:
            self._proxy.call("finish", step=self._committed,
                             timeout_ms=int(self._quorum_timeout * 1000))
        except _ProxyError as e:
            _log("telling the quorum that training finished: %s" % e)
        self._drop_group()
        self._asks.stop()
        self._proxy.close()

    @property
    def committed_step(self):
        return self._committed

    @property
    def quorum_size(self):
        return self._size

    # -- the quorum ------------------------------------------------------------------------

    def _ask(self, committed, rebuild):
        return self._proxy.call("quorum", committed=int(committed), rebuild=bool(rebuild),
                                timeout_ms=int(self._quorum_timeout * 1000))

    def _no_quorum(self, error):
        return RuntimeError(
            "fault tolerance: no quorum for step %d within %gs (this replica is on the minority "
            "side of a partition, or too few replicas are live): %s"
            % (self._committed + 1, self._quorum_timeout, error))

    def _resolve_answer(self):
        """Takes the overlapped ask's answer, if one is pending: the step goes on, or is lost
        when the quorum changed under it (or none formed: should_commit() raises that)."""
        if self._pending is None:
            return
        done, result = self._pending
        self._pending = None
        done.wait()
        if "error" in result:
            self._lost = self._skip = True
            self._fatal = self._no_quorum(result["error"])
            return
        reply = result["reply"]
        if not self._continues(reply):
            # Redone under the new quorum, which the next begin_step() adopts without asking
            # again: every member got the same answer, and all skip the step's collectives.
            if not self._lost:
                _log("step %d lost: the quorum changed under it" % (self._committed + 1))
            self._lost = self._skip = True
            self._changed = reply

    def _continues(self, reply):
        quorum, plan = reply["quorum"], reply["plan"]
        members = [m["replica"] for m in quorum["members"]]
        return (quorum["store_prefix"] == self._prefix and members == self._members and
                plan["rank"] == self._rank and all(h is None for h in plan["heal_from"]))

    def _settle(self):
        deadline = time.monotonic() + self._quorum_timeout
        while True:
            if self._changed is not None:
                reply, self._changed = self._changed, None
            else:
                try:
                    reply = self._ask(self._committed, self._broken or self._group is None)
                except _ProxyError as e:
                    raise self._no_quorum(e) from None
            _beat()  # an answer is progress: a survivor waiting out a hung peer is not hung
            quorum, plan = reply["quorum"], reply["plan"]
            if quorum.get("finished"):
                self._finished_at = int(quorum["max_step"])
                return
            why = self._adopt(quorum, plan)
            if not why:
                return
            _log("quorum %d: %s; asking again" % (quorum["quorum_id"], why))
            if time.monotonic() >= deadline:
                raise RuntimeError("fault tolerance: no working communicator within the quorum "
                                   "timeout (%gs): %s" % (self._quorum_timeout, why))

    def _adopt(self, quorum, plan):
        """Empty when the quorum is this replica's: its group built, this replica healed."""
        rank, size = plan["rank"], int(plan["size"])
        if rank is None:
            raise RuntimeError("fault tolerance: the quorum does not train this replica")
        try:
            if self._group is None or quorum["store_prefix"] != self._prefix:
                self._drop_group()  # the old group first: its peers may be gone
                self._group = self._build_group(quorum["store_prefix"], rank, size)
                self.stats["rebuilds"] += 1
            self._heal(quorum, plan, rank)
        except RuntimeError as e:
            self._drop_group()
            self._broken = True
            return _first_line(e)
        self._prefix = quorum["store_prefix"]
        self._members = [m["replica"] for m in quorum["members"]]
        self._rank, self._size = rank, size
        self._broken = False
        return ""

    def _build_group(self, prefix, rank, size):
        import datetime
        import torch.distributed as dist
        store = dist.PrefixStore(prefix, self._store)
        timeout = datetime.timedelta(seconds=self._collective_timeout)
        if self._backend == "gloo":
            return dist.ProcessGroupGloo(store, rank, size, timeout)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)

    def _drop_group(self):
        group, self._group = self._group, None
        self._prefix = None
        if group is not None and self._backend == "nccl":
            abort = getattr(group, "abort", None) or getattr(group, "_abort", None)
            if abort is not None:
                try:
                    abort()
                except RuntimeError:
                    pass

    def _collective_failed(self, why):
        if not self._lost:
            _log("step %d lost: %s" % (self._committed + 1, why))
        self._lost = True
        self._broken = True

    # -- the step's collectives ------------------------------------------------------------

    def _average_gradients(self):
        torch = self._torch
        params = [p for p in self.model.parameters() if p.requires_grad]
        by_kind = {}
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # a replica whose share was empty adds nothing
            by_kind.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in by_kind.values():
            flat = torch.cat([g.reshape(-1) for g in grads]).to(self._device)
            self._group.allreduce([flat]).wait()
            flat /= self._size
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[offset:offset + n].view_as(g))
                offset += n

    # -- healing ---------------------------------------------------------------------------

    def _state_bytes(self):
        import io
        torch = self._torch
        state = {"step": self._committed, "model": self.model.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state()}
        if self.sampler is not None:
            state["sampler"] = self.sampler.state_dict()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    def _load_state(self, data):
        import io
        torch = self._torch
        try:  # a peer's own state over the job's group: not only tensors (torch 2.6 default)
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        except TypeError:  # a torch without weights_only
            state = torch.load(io.BytesIO(data), map_location="cpu")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        if self.sampler is not None and "sampler" in state:
            self.sampler.load_state_dict(state["sampler"])
        return int(state["step"])

    def _heal(self, quorum, plan, rank):
        torch = self._torch
        state = None
        for to, source in enumerate(plan["heal_from"]):
            if source is None:
                continue
            if source == rank:
                if state is None:
                    state = self._state_bytes()
                length = torch.tensor([len(state)], dtype=torch.int64, device=self._device)
                self._group.send([length], to, 0).wait()
                data = torch.frombuffer(bytearray(state), dtype=torch.uint8).to(self._device)
                self._group.send([data], to, 1).wait()
                self.stats["heals_sent"] += 1
            elif to == rank:
                length = torch.zeros(1, dtype=torch.int64, device=self._device)
                self._group.recv([length], source, 0).wait()
                size = int(length.item())
                if not 0 < size < (1 << 40):
                    raise RuntimeError("healing: the peer announced %d bytes" % size)
                data = torch.empty(size, dtype=torch.uint8, device=self._device)
                self._group.recv([data], source, 1).wait()
                step = self._load_state(data.cpu().numpy().tobytes())
                if step != int(plan["step"]):
                    raise RuntimeError("healing: the peer sent step %d, the quorum trains from "
                                       "step %d" % (step, plan["step"]))
                self._committed = step
                self.stats["heals_received"] += 1
                if step > 0:
                    member = quorum["members"][plan["trainers"][source]]
                    _log("healed from %s at step %d" % (member["replica"], step))


def _flight_record_summary(path, rank):
    """The last collective of each process group in an NCCL Flight Recorder dump (torch 2.x
    writes it as a pickle of plain dicts and lists), as the agent's hang report reads it."""
    import json
    import pickle

    with open(path, "rb") as f:
        dump = pickle.load(f)
    last = {}
    for entry in dump.get("entries", []):
        if entry.get("is_p2p"):
            continue
        group = entry.get("process_group") or (entry.get("pg_id"),)
        name = str(group[0] if isinstance(group, (tuple, list)) else group)
        seq = int(entry.get("collective_seq_id") or 0)
        if name not in last or seq >= last[name]["seq"]:
            last[name] = {"group": name, "seq": seq, "op": str(entry.get("profiling_name", "")),
                          "state": str(entry.get("state", ""))}
    print(json.dumps({"rank": rank, "last": sorted(last.values(), key=lambda l: l["group"])}))


if __name__ == "__main__":
    # `python3 ctrun_worker.py fr_summary DUMP RANK`: the agent's reader of Flight Recorder dumps.
    if len(sys.argv) == 4 and sys.argv[1] == "fr_summary":
        _flight_record_summary(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit("usage: ctrun_worker.py fr_summary DUMP RANK")

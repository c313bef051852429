// Package kmsg reads the kernel log as a second source of GPU health signals, beside NVML.
//
// The NVIDIA driver writes every XID, and a few faults that carry no XID at all (a GPU that
// failed to initialise, a GPU that fell off the bus before NVML could see it), to the kernel
// log. NVML's event API misses events that happen while no one is subscribed and cannot report
// a GPU it cannot open; the kernel log keeps them. This package turns that log into data:
//
//   - [ParseRecord] parses one record as read from /dev/kmsg (see the kernel's
//     Documentation/ABI/testing/dev-kmsg): priority, sequence number, time since boot,
//     the unescaped message and its dictionary lines (SUBSYSTEM=, DEVICE=).
//   - [ParseNVRM] turns one "NVRM: ..." driver message into an [Event]: an XID with its
//     process, MIG scope and (XID 154) new recovery action; a GPU that failed to initialise;
//     a GPU lost from the bus; or the line that names the UUID of the GPU at a PCI bus ID.
//   - [Reader] reads /dev/kmsg one record per read(2): [Open] it from the oldest record the
//     kernel still holds (a replay since boot, as far as the buffer reaches) or, with
//     [SeekEnd], from the next record logged; [Reader.Next] blocks until a record arrives and
//     honours its context. Records the kernel overwrote before they were read (EPIPE) and
//     records that do not parse are counted ([Reader.Overruns], [Reader.Malformed]) and
//     skipped, never fatal.
//   - [Mapper] turns an Event into the library's signals for one inventory, naming GPUs by
//     UUID through their PCI bus IDs (and the identity lines): an XID with its MIG scope, the
//     recovery action of XID 154, a lost GPU (also for one that failed to initialise).
//   - [Source] puts these together: [OpenSource] replays the buffer since boot, skips what the
//     checkpoint's [health.Cursor] says was applied before a restart, follows new records, and
//     feeds a [ReplaySink] (a *health.Monitor) one record at a time with [health.Monitor.Advance],
//     so the cursor and the faults it produced are saved together. Only records of the kernel
//     facility count: an NVRM line a process wrote is counted as spoofed ([Stats]).
//   - [Relay] reads the log for processes that may not open /dev/kmsg (a container runtime lets
//     only a privileged container): it keeps the driver's records (kernel facility, "NVRM:") in
//     a bounded buffer and hands them, one line each with its sequence number, to the clients of
//     a Unix socket; [DialRelay] is the other end, a [RelayReader] a Source reads as it reads a
//     [Reader] (SourceOptions.RelaySocket). `gpuhealth kmsg-relay` runs one.
//   - [Companion] runs the kernel log beside a GPU backend as the agent and the device plugin
//     do: opened again after read errors, its XIDs and the backend's paired up by a
//     [health.Dedup] so that one reported by both counts once, the backend's fed to the
//     Monitor through [Companion.BackendFeed] (a [health.Feed]: NVML's signals never pass
//     through this package's code).
//
// ParseRecord and ParseNVRM are pure functions of their input, so they are safe for
// concurrent use. The package imports nothing from Kubernetes, so a device plugin or a DRA
// driver can embed it. docs/kernel-log.md describes the source as the agent runs it.
package kmsg

package kmsg

import (
	"reflect"
	"testing"
)

// The lines below are real driver output, collected from public reports; the XID codes,
// addresses, pids and process names are kept as reported. Sources, oldest driver first:
//
//   - pastebin.com/gn6mYmM4 (2012) and pastebin.com/zhK16889: pre-"PCI:" address forms,
//     "Xid (0000:01:00): 13, 0005 ..." and "Xid (0009:00): 53, CMDre ...".
//   - github.com/Bumblebee-Project/Bumblebee/issues/677 (2015): "Xid (PCI:0000:01:00): 32,
//     Channel ID ..." and "31, Ch 00000003, engmask ...", no pid field.
//   - docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html: XID 48/63/64 texts
//     ("An uncorrectable double bit error (DBE) has been detected on GPU (<id>)").
//   - github.com/NVIDIA/gpu-operator/issues/1146, github.com/NVIDIA/cuda-samples/issues/104
//     (510.47), github.com/NVIDIA/open-gpu-kernel-modules/issues/1151 (595.71.05):
//     "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)".
//   - github.com/akash-network/support/issues/244 (535.183.01): "NVRM: GPU at PCI:0000:00:05:
//     GPU-<uuid>" before the first XID of a GPU; XID 43/31 with pid=, 94 with pid='<unknown>'.
//   - github.com/leptonai/gpud/pull/46 (2024): pid='<unknown>', name=<unknown>; XID 109 with
//     "Ch 00000008, errorString CTX SWITCH TIMEOUT".
//   - github.com/NVIDIA/NVSentinel/issues/155 (570.158.01): the three-line "The NVIDIA GPU
//     0000:b3:00.0 ... fallen off the bus" message with no XID, and "Xid (PCI:0000:44:00): 79,
//     GPU has fallen off the bus".
//   - github.com/leptonai/gpud/pull/1160 and /pull/1174 (R570+): NVLink5 XIDs 144-149 with no
//     pid and domains other than 0000 ("PCI:0019:01:00").
//   - github.com/NVIDIA/open-gpu-kernel-modules/issues/1150 (590.48.01): "45, pid=..., name=...,
//     Ch 00000001 caused by previous Xid 149".
//   - github.com/NVIDIA/NVSentinel, health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go
//     (NVIDIA's own syslog monitor, R570-R580): XID 154 "GPU recovery action changed from 0x0
//     (None) to 0x1 (GPU Reset Required)" and back to none, a bare "Xid (PCI:0000:3f:00): 46" with
//     nothing after the code, an address with its function ("PCI:0000:00:08.0"), NVLink5 XID 149
//     with doubled spaces, and a cut-short "154 (" that must not be lost.
//   - github.com/NVIDIA/open-gpu-kernel-modules/issues/1134 (595.71.05, "Xid 31 -> Xid 154 (Node
//     Reboot Required)") and /issues/1353 (595.84 to 610.57.04, XID 154 announcing "PF FLR"): the
//     action names change between branches; the number before them does not.
//   - A public crash report of the R610 open module (610.43.02; found through a code search whose
//     index does not name the repository): after "Xid (PCI:0000:01:00): 79, GPU has fallen off the
//     bus." the driver adds "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus." and "Xid
//     (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)".
//
// Not found verbatim in a public log (taken from the issue that asked for this package, and to
// be checked against a MIG node and an R575+ driver): the MIG scope suffixes ("GPU-I 1, CI 0"
// and "(GI 1, CI 0)") and the XID 154 "GPU recovery action changed from ... to ..." text. The
// driver's own source prints the MIG instance inside the parentheses instead ("PCI:0000:01:00
// GPU-I:05"); those cases cite it.
func TestParseNVRM(t *testing.T) {
	action := func(a RecoveryAction) *RecoveryAction { return &a }
	tests := []struct {
		name   string
		msg    string
		want   Event
		wantOK bool
	}{
		{
			name:   "pre-PCI: address form (2012)",
			msg:    "NVRM: Xid (0000:01:00): 13, 0005 00000000 0000502d 00000104 00000000 00000100",
			want:   Event{Kind: KindXid, PCIBusID: "0000:01:00.0", Xid: 13, Detail: "0005 00000000 0000502d 00000104 00000000 00000100"},
			wantOK: true,
		},
		{
			name:   "two-part address keeps the XID without a bus ID",
			msg:    "NVRM: Xid (0009:00): 53, CMDre 00000000 00000080 00000000 00000005 00000005",
			want:   Event{Kind: KindXid, Xid: 53, Detail: "CMDre 00000000 00000080 00000000 00000005 00000005"},
			wantOK: true,
		},
		{
			name:   "no pid field (2015)",
			msg:    "NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000",
			want:   Event{Kind: KindXid, PCIBusID: "0000:01:00.0", Xid: 31, Detail: "Ch 00000003, engmask 00000101, intr 10000000"},
			wantOK: true,
		},
		{
			name:   "XID 48 double bit error, no pid",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 48, Detail: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."},
			wantOK: true,
		},
		{
			name:   "XID 79 with pid and name",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 79, PID: 1234, Process: "python", Detail: "GPU has fallen off the bus."},
			wantOK: true,
		},
		{
			name:   "XID 79 without pid (570)",
			msg:    "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.",
			want:   Event{Kind: KindXid, PCIBusID: "0000:44:00.0", Xid: 79, Detail: "GPU has fallen off the bus."},
			wantOK: true,
		},
		{
			name:   "quoted unknown pid",
			msg:    "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
			want:   Event{Kind: KindXid, PCIBusID: "0000:cb:00.0", Xid: 13, Detail: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"},
			wantOK: true,
		},
		{
			name:   "unquoted unknown pid",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 119, pid=<unknown>, name=<unknown>, Timeout after 6s of waiting for RPC response from GPU0 GSP!",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 119, Detail: "Timeout after 6s of waiting for RPC response from GPU0 GSP!"},
			wantOK: true,
		},
		{
			name:   "XID 109 with channel and errorString",
			msg:    "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
			want:   Event{Kind: KindXid, PCIBusID: "0000:cb:00.0", Xid: 109, PID: 1797828, Process: "pt_main_thread", Detail: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"},
			wantOK: true,
		},
		{
			name:   "XID 94 contained, unknown process (535)",
			msg:    "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
			want:   Event{Kind: KindXid, PCIBusID: "0000:00:08.0", Xid: 94, Detail: "Contained: SM (0x1). RST: No, D-RST: No"},
			wantOK: true,
		},
		{
			name:   "XID 45 caused by a previous XID (590)",
			msg:    "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
			want:   Event{Kind: KindXid, PCIBusID: "0000:dc:00.0", Xid: 45, PID: 1818990, Process: "python3", CausedByXid: 149, Detail: "Ch 00000001 caused by previous Xid 149"},
			wantOK: true,
		},
		{
			name:   "NVLink5 XID 149 on a non-zero domain",
			msg:    "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
			want:   Event{Kind: KindXid, PCIBusID: "0019:01:00.0", Xid: 149, NVLink: &NVLinkError{Unit: "NETIR", Severity: SeverityFatal, Link: NoLink}, Detail: "NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"},
			wantOK: true,
		},
		{
			name:   "MIG scope, GPU-I style",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 94, pid=4242, name=trainer, Ch 00000008, GPU-I 1, CI 0",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 94, PID: 4242, Process: "trainer", MIG: &MIGScope{GPUInstance: 1, ComputeInstance: 0}, Detail: "Ch 00000008, GPU-I 1, CI 0"},
			wantOK: true,
		},
		{
			name:   "MIG scope, (GI, CI) style",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 43, pid=77, name=python3, Ch 00000009 (GI 2, CI 3)",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 43, PID: 77, Process: "python3", MIG: &MIGScope{GPUInstance: 2, ComputeInstance: 3}, Detail: "Ch 00000009 (GI 2, CI 3)"},
			wantOK: true,
		},
		{
			// Both MIG forms the driver prints, inside the parentheses: the example in
			// kern_gpu_error_cont_ga100.c and the format string in kernel_rc.c
			// (NVIDIA/open-gpu-kernel-modules, R515 to R595.45.04). The GPU-CI line is built from
			// that format string; no public log of one was found.
			name:   "MIG attribution beside the address, GPU instance (R515+)",
			msg:    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
			want:   Event{Kind: KindXid, PCIBusID: "0000:01:00.0", Xid: 94, PID: 7194, MIG: &MIGScope{GPUInstance: 5, ComputeInstance: -1}, Detail: "Contained: CE User Channel (0x9). RST: No, D-RST: No"},
			wantOK: true,
		},
		{
			name:   "MIG attribution beside the address, GPU and compute instance (R515+)",
			msg:    "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 43, pid=77, name=python3, Ch 00000009",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 43, PID: 77, Process: "python3", MIG: &MIGScope{GPUInstance: 1, ComputeInstance: 2}, Detail: "Ch 00000009"},
			wantOK: true,
		},
		{
			name:   "MIG attribution that cannot be read leaves the XID on the whole GPU",
			msg:    "NVRM: Xid (PCI:0000:3b:00 GPU-I:99999999999): 43, pid=77, name=python3, Ch 00000009",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 43, PID: 77, Process: "python3", Detail: "Ch 00000009"},
			wantOK: true,
		},
		{
			name:   "MIG scope, GPU instance only",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 31, pid=77, name=python3, Ch 00000009, GPU-I 5, intr 00000000",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 31, PID: 77, Process: "python3", MIG: &MIGScope{GPUInstance: 5, ComputeInstance: -1}, Detail: "Ch 00000009, GPU-I 5, intr 00000000"},
			wantOK: true,
		},
		{
			name:   "XID 154 recovery action",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 154, RecoveryAction: action(RecoveryGPUReset), Detail: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"},
			wantOK: true,
		},
		{
			name:   "XID 154 back to none",
			msg:    "NVRM: Xid (PCI:0000:3b:00): 154, pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 154, RecoveryAction: action(RecoveryNone), Detail: "GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)"},
			wantOK: true,
		},
		{
			name:   "XID 154 to PF FLR (R595+ action names)",
			msg:    "NVRM: Xid (PCI:0000:0d:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)",
			want:   Event{Kind: KindXid, PCIBusID: "0000:0d:00.0", Xid: 154, RecoveryAction: action(RecoveryGPUReset), Detail: "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)"},
			wantOK: true,
		},
		{
			name:   "XID 154 to OS Reboot (R610)",
			msg:    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
			want:   Event{Kind: KindXid, PCIBusID: "0000:01:00.0", Xid: 154, RecoveryAction: action(RecoveryNodeReboot), Detail: "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)"},
			wantOK: true,
		},
		{
			name:   "XID 154 on a non-zero domain (NVSentinel)",
			msg:    "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
			want:   Event{Kind: KindXid, PCIBusID: "0008:01:00.0", Xid: 154, RecoveryAction: action(RecoveryNone), Detail: "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"},
			wantOK: true,
		},
		{
			name:   "XID cut short after its code keeps the code",
			msg:    "NVRM: Xid (PCI:0000:01:00): 154 (",
			want:   Event{Kind: KindXid, PCIBusID: "0000:01:00.0", Xid: 154},
			wantOK: true,
		},
		{
			name:   "bare XID, nothing after the code",
			msg:    "NVRM: Xid (PCI:0000:3f:00): 46",
			want:   Event{Kind: KindXid, PCIBusID: "0000:3f:00.0", Xid: 46},
			wantOK: true,
		},
		{
			name:   "address with its function (R575+ NVLink5)",
			msg:    "NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)",
			want:   Event{Kind: KindXid, PCIBusID: "0000:00:08.0", Xid: 145, NVLink: &NVLinkError{Unit: "RLW_REMAP", Severity: SeverityNonfatal, Link: 10}, Detail: "RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)"},
			wantOK: true,
		},
		{
			name:   "GPU fallen off the bus, R610 form",
			msg:    "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
			want:   Event{Kind: KindLost, PCIBusID: "0000:01:00.0", Detail: "GPU has fallen off the bus."},
			wantOK: true,
		},
		{
			name:   "RmInitAdapter failed",
			msg:    "NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)",
			want:   Event{Kind: KindInitFailed, PCIBusID: "0000:0a:00.0", Detail: "(0x24:0x72:1568)"},
			wantOK: true,
		},
		{
			name:   "rm_init_adapter follow-up line makes no second event",
			msg:    "NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5",
			wantOK: false,
		},
		{
			name:   "GPU at PCI fallen off the bus",
			msg:    "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.",
			want:   Event{Kind: KindLost, PCIBusID: "0000:3b:00.0", Detail: "GPU has fallen off the bus."},
			wantOK: true,
		},
		{
			name:   "three-line fallen off the bus (570 open module)",
			msg:    "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands.",
			want:   Event{Kind: KindLost, PCIBusID: "0000:b3:00.0", Detail: "NVRM: (PCI ID: 10de:26b5) installed in this system has\nNVRM: fallen off the bus and is not responding to commands."},
			wantOK: true,
		},
		{
			name:   "bus ID to UUID",
			msg:    "NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375",
			want:   Event{Kind: KindIdentity, PCIBusID: "0000:00:05.0", UUID: "GPU-efbdfde9-5798-a6e7-4c46-12518fa15375"},
			wantOK: true,
		},
		{name: "board serial number is not modelled", msg: "NVRM: GPU Board Serial Number: 1650423013443"},
		{name: "driver banner", msg: "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024"},
		{name: "not NVRM", msg: "pci 0000:3b:00.0: [10de:2330] type 00 class 0x030200"},
		{name: "NVRM without separator", msg: "NVRM nvCheckOkFailedNoLog: Check failed: Requested object not found"},
		{name: "Xid without code", msg: "NVRM: Xid (PCI:0000:3b:00): , pid=1"},
		{name: "Xid without closing paren", msg: "NVRM: Xid (PCI:0000:3b:00 79"},
		{name: "empty", msg: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseNVRM(tc.msg)
			if ok != tc.wantOK {
				t.Fatalf("ParseNVRM(%q) ok = %v, want %v (event %+v)", tc.msg, ok, tc.wantOK, got)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseNVRM(%q)\n got %+v\nwant %+v", tc.msg, got, tc.want)
			}
		})
	}
}

// TestParseNVRMQualifiers covers what the driver writes beside an XID's code: the unit, severity
// and link of NVLink XIDs, and the XID an earlier one caused. One case per form; each line is
// verbatim from the source named above it. Sources:
//
//   - leptonai/gpud: pull/1160 and pull/1174 (descriptions quote kmsg input), and the test
//     fixtures in components/accelerator/nvidia/xid/: kmsg_extended_test.go ("production log
//     lines"), health_state_test.go and nvlink_logs_test.go (lines built from NVIDIA's XID
//     catalog rather than taken from a node: the four-register form and the units with a slash).
//   - NVIDIA/NVSentinel, health-monitors/syslog-health-monitor/pkg/xid/parser/csv_test.go.
//   - NVIDIA/open-gpu-kernel-modules: src/nvidia/src/kernel/gpu/rc/kernel_rc.c (the format
//     string, " caused by previous Xid %d", appended to XID 45 only, since 570.124.04) and
//     issue 1150 (590.48.01, the lines themselves).
//   - forums.developer.nvidia.com/t/292539 (XID 74 without registers).
//
// Not modelled: XID 137 ("RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error", NVIDIA/nccl
// issue 2241, its address redacted by the reporter), the only public example found.
func TestParseNVRMQualifiers(t *testing.T) {
	tests := []struct {
		name string
		msg  string
		want Event
	}{
		{
			// gpud pull/1160.
			name: "NVLink5 144 Nonfatal, link without padding",
			msg:  "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
			want: Event{Kind: KindXid, PCIBusID: "0000:01:00.0", Xid: 144, NVLink: &NVLinkError{Unit: "SAW_MVB", Severity: SeverityNonfatal, Link: 0},
				Detail: "SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)"},
		},
		{
			// gpud pull/1160.
			name: "NVLink5 149 Fatal, zero-padded link",
			msg:  "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
			want: Event{Kind: KindXid, PCIBusID: "0000:00:00.0", Xid: 149, NVLink: &NVLinkError{Unit: "NETIR_LINK_EVT", Severity: SeverityFatal, Link: 0},
				Detail: "NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"},
		},
		{
			// gpud kmsg_extended_test.go ("Log2"); the same line without pid in pull/1174.
			name: "NVLink5 145 with pid and a name holding colons",
			msg:  "NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
			want: Event{Kind: KindXid, PCIBusID: "0018:01:00.0", Xid: 145, PID: 876767, Process: "ray::WorkerDict", NVLink: &NVLinkError{Unit: "RLW_RXPIPE", Severity: SeverityNonfatal, Link: 13},
				Detail: "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"},
		},
		{
			// gpud kmsg_extended_test.go ("Log1"): XID 149 is not always fatal, which is what
			// gpud pull/1174 ("Non-fatal events incorrectly reported as Fatal") fixed.
			name: "NVLink5 149 Nonfatal",
			msg:  "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)",
			want: Event{Kind: KindXid, PCIBusID: "0018:01:00.0", Xid: 149, NVLink: &NVLinkError{Unit: "NETIR_BER_EVENT", Severity: SeverityNonfatal, Link: 3},
				Detail: "NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 (0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)"},
		},
		{
			// NVSentinel csv_test.go ("NL5 XID"); gpud kmsg_test.go has the same spacing.
			name: "NVLink5 149 with runs of spaces",
			msg:  "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
			want: Event{Kind: KindXid, PCIBusID: "0018:01:00.0", Xid: 149, NVLink: &NVLinkError{Unit: "NETIR_LINK_EVT", Severity: SeverityFatal, Link: 9},
				Detail: "NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"},
		},
		{
			// gpud health_state_test.go (catalog-built).
			name: "NVLink5 150 with four registers",
			msg:  "NVRM: Xid (PCI:0000:04:00): 150, MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)",
			want: Event{Kind: KindXid, PCIBusID: "0000:04:00.0", Xid: 150, NVLink: &NVLinkError{Unit: "MSE_WATCHDOG", Severity: SeverityFatal, Link: 0},
				Detail: "MSE_WATCHDOG Fatal XC0 i0 Link 00 (0x00000000 0x00000000 0x00000000 0x00000000)"},
		},
		{
			// gpud nvlink_logs_test.go (catalog-built).
			name: "NVLink5 146 unit with a slash",
			msg:  "NVRM: Xid (PCI:0000:04:00): 146, TLW_RX/TLW_RX_PIPE0 Nonfatal XC0 i0 Link 00 (0x0000000a 0x00000001 0x00000000 0x00000000)",
			want: Event{Kind: KindXid, PCIBusID: "0000:04:00.0", Xid: 146, NVLink: &NVLinkError{Unit: "TLW_RX/TLW_RX_PIPE0", Severity: SeverityNonfatal, Link: 0},
				Detail: "TLW_RX/TLW_RX_PIPE0 Nonfatal XC0 i0 Link 00 (0x0000000a 0x00000001 0x00000000 0x00000000)"},
		},
		{
			// gpud kmsg_extended_test.go (TestExtractNVRMXidInfoExtendedShortMatch).
			name: "NVLink5 line cut short in its registers keeps its qualifiers",
			msg:  "NVRM: Xid (PCI:0018:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406",
			want: Event{Kind: KindXid, PCIBusID: "0018:01:00.0", Xid: 149, NVLink: &NVLinkError{Unit: "NETIR", Severity: SeverityFatal, Link: NoLink},
				Detail: "NETIR Fatal XC0 i0 Link -1 (0x000fe406"},
		},
		{
			// NVSentinel csv_test.go ("XID 74 with NVLINK ID and registers values").
			name: "XID 74 fatal on a link, with registers",
			msg:  "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
			want: Event{Kind: KindXid, PCIBusID: "0003:00:00.0", Xid: 74, NVLink: &NVLinkError{Severity: SeverityFatal, Link: 14},
				Detail: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)"},
		},
		{
			// forums.developer.nvidia.com/t/292539 (its title).
			name: "XID 74 fatal on a link, no registers",
			msg:  "NVRM: Xid (PCI:0000:c1:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 1",
			want: Event{Kind: KindXid, PCIBusID: "0000:c1:00.0", Xid: 74, NVLink: &NVLinkError{Severity: SeverityFatal, Link: 1},
				Detail: "NVLink: fatal error detected on link 1"},
		},
		{
			// open-gpu-kernel-modules issue 1150: the XID 45s that follow a 145 on other GPUs.
			name: "XID 45 caused by a previous 145",
			msg:  "NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145",
			want: Event{Kind: KindXid, PCIBusID: "0000:ed:00.0", Xid: 45, PID: 1818992, Process: "python3", CausedByXid: 145,
				Detail: "Ch 0000000c caused by previous Xid 145"},
		},
		{
			// kernel_rc.c prints the phrase even when the message before it is empty.
			name: "caused by, nothing before it",
			msg:  "NVRM: Xid (PCI:0000:ed:00): 45,  caused by previous Xid 149",
			want: Event{Kind: KindXid, PCIBusID: "0000:ed:00.0", Xid: 45, CausedByXid: 149, Detail: "caused by previous Xid 149"},
		},
		// Made-up lines: what must not be read as a qualifier, and what cannot be one.
		{
			name: "severity word without the XC field is not NVLink5",
			msg:  "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Fatal error",
			want: Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 13, PID: 1, Process: "a", Detail: "Graphics Fatal error"},
		},
		{
			name: "unknown severity word is not NVLink5",
			msg:  "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Corrected XC0 i0 Link 3 (0x1)",
			want: Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 145, Detail: "RLW_RXPIPE Corrected XC0 i0 Link 3 (0x1)"},
		},
		{
			name: "unreadable link number",
			msg:  "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link x3 (0x1)",
			want: Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 145, NVLink: &NVLinkError{Unit: "RLW_RXPIPE", Severity: SeverityNonfatal, Link: NoLink}, Detail: "RLW_RXPIPE Nonfatal XC0 i0 Link x3 (0x1)"},
		},
		{
			name: "link number beyond int",
			msg:  "NVRM: Xid (PCI:0000:3b:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 99999999999999999999 (0x1)",
			want: Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 145, NVLink: &NVLinkError{Unit: "RLW_RXPIPE", Severity: SeverityNonfatal, Link: NoLink}, Detail: "RLW_RXPIPE Nonfatal XC0 i0 Link 99999999999999999999 (0x1)"},
		},
		{
			name: "no Link field before the registers",
			msg:  "NVRM: Xid (PCI:0000:3b:00): 149, NETIR Fatal XC0 i0 (0x000fe406) Link 3",
			want: Event{Kind: KindXid, PCIBusID: "0000:3b:00.0", Xid: 149, NVLink: &NVLinkError{Unit: "NETIR", Severity: SeverityFatal, Link: NoLink}, Detail: "NETIR Fatal XC0 i0 (0x000fe406) Link 3"},
		},
		{
			name: "caused by without a number",
			msg:  "NVRM: Xid (PCI:0000:ed:00): 45, Ch 0000000c caused by previous Xid ",
			want: Event{Kind: KindXid, PCIBusID: "0000:ed:00.0", Xid: 45, Detail: "Ch 0000000c caused by previous Xid "},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseNVRM(tc.msg)
			if !ok {
				t.Fatalf("ParseNVRM(%q) ok = false, want an event", tc.msg)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseNVRM(%q)\n got %+v %+v\nwant %+v %+v", tc.msg, got, got.NVLink, tc.want, tc.want.NVLink)
			}
		})
	}
}

func TestSeverityString(t *testing.T) {
	for s, want := range map[Severity]string{SeverityUnknown: "Unknown", SeverityNonfatal: "Nonfatal", SeverityFatal: "Fatal", 9: "Severity(9)"} {
		if got := s.String(); got != want {
			t.Errorf("Severity(%d).String() = %q, want %q", uint8(s), got, want)
		}
	}
}

// A record as the kernel hands it over, escapes and all, parses through both layers.
func TestParseNVRMFromRecord(t *testing.T) {
	r, err := ParseRecord(`3,2113,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has\x0aNVRM: fallen off the bus and is not responding to commands.`)
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := ParseNVRM(r.Message)
	if !ok || ev.Kind != KindLost || ev.PCIBusID != "0000:b3:00.0" {
		t.Errorf("ParseNVRM(%q) = %+v, %v; want a Lost event for 0000:b3:00.0", r.Message, ev, ok)
	}
}

func TestNormalizeBusID(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"0000:3b:00", "0000:3b:00.0", true},
		{"0000:3B:00.0", "0000:3b:00.0", true},
		{"00000000:3B:00.0", "0000:3b:00.0", true},
		{"0019:01:00.1", "0019:01:00.1", true},
		{"0009:00", "", false},
		{"0000:3b:0g", "", false},
		{"12345678:3b:00.0", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := NormalizeBusID(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("NormalizeBusID(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestKindString(t *testing.T) {
	for k, want := range map[Kind]string{KindXid: "Xid", KindInitFailed: "InitFailed", KindLost: "Lost", KindIdentity: "Identity", 0: "Kind(0)"} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

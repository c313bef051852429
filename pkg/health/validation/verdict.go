package validation

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Format says how a validation command reports its verdict.
type Format string

const (
	// FormatDCGM is the JSON of `dcgmi diag -j` (DCGM 3.x and 4.x) plus its exit code.
	FormatDCGM Format = "dcgm"
	// FormatExitCode: 0 passes, anything else fails; the output is the message.
	FormatExitCode Format = "exitCode"
)

// ParseFormat parses a configured format; the empty string is FormatDCGM, the default command's.
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case "", FormatDCGM:
		return FormatDCGM, nil
	case FormatExitCode:
		return FormatExitCode, nil
	}
	return "", fmt.Errorf("unknown validation format %q (want %q or %q)", s, FormatDCGM, FormatExitCode)
}

// Result is what a validation concluded about the GPU.
type Result string

const (
	// Passed: a pass for this GPU was parsed.
	Passed Result = "passed"
	// Failed: the GPU failed the test; it counts as a failed repair attempt.
	Failed Result = "failed"
	// Error: no verdict could be read; the GPU stays out, no attempt is counted, it is retried.
	Error Result = "error"
)

// Verdict is one validation's outcome, ready for an Event.
type Verdict struct {
	Result Result
	// Message: for Failed the failing tests in DCGM's own words, e.g.
	// `diagnostic: Fail: "..." (DCGM error 95, severity ISOLATE)`; for Error why no verdict
	// could be read; for Passed a short summary ("3 tests passed: software, memory, diagnostic").
	Message string
	// Warnings are findings that are not faults (a DCGM warning of severity MONITOR or CONFIG),
	// for the Event; they never make a Fail.
	Warnings []string
	// Tests are the tests that ran on this GPU with their status, "memory: Pass".
	Tests []string
	// Version is the DCGM version the document names, when it names one.
	Version string
}

// Read reads a verdict in the given format. An unknown format is an Error rather than a guess.
func Read(format Format, output []byte, exitCode int, target Target) Verdict {
	switch format {
	case "", FormatDCGM:
		return ReadDCGM(output, exitCode, target)
	case FormatExitCode:
		return ReadExitCode(output, exitCode)
	}
	return errorf("unknown validation format %q", format)
}

// ReadExitCode judges a command that reports by exit code alone: 0 passes, anything else fails
// with the output as the message. A negative exit code (killed by a signal, never run) says
// nothing about the GPU, so it is an Error.
func ReadExitCode(output []byte, exitCode int) Verdict {
	out := excerpt(output, maxMessage)
	switch {
	case exitCode < 0:
		msg := "the command did not exit normally (killed by a signal or not run)"
		if out != "" {
			msg += ": " + out
		}
		return Verdict{Result: Error, Message: msg}
	case exitCode == 0:
		msg := "exited 0"
		if out != "" {
			msg += ": " + out
		}
		return Verdict{Result: Passed, Message: clip(msg, maxMessage)}
	}
	msg := fmt.Sprintf("exited %d", exitCode)
	if out != "" {
		msg += ": " + out
	}
	return Verdict{Result: Failed, Message: clip(msg, maxMessage)}
}

// maxMessage keeps a message fit for an Event (whose note the API server caps at 1 KiB).
const maxMessage = 1024

func errorf(format string, args ...any) Verdict {
	return Verdict{Result: Error, Message: clip(fmt.Sprintf(format, args...), maxMessage)}
}

// excerpt is output fit for a message: trimmed, valid UTF-8, at most n bytes.
func excerpt(b []byte, n int) string {
	if len(b) > 4*n {
		// Only the head is shown; converting megabytes of output would be waste.
		b = b[:4*n]
	}
	return clip(strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD")), n)
}

// clip shortens s to at most n bytes without splitting a character, marking the cut.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// firstLines is the start of the output, for an exit code no document explains.
func firstLines(b []byte, lines int) string {
	s := excerpt(b, 300)
	parts := strings.SplitN(s, "\n", lines+1)
	if len(parts) > lines {
		parts = parts[:lines]
	}
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return strings.Join(parts, " | ")
}

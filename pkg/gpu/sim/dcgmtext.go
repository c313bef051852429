package sim

import (
	"fmt"
	"strings"
)

// dcgmi diag's table without -j (Diag.cpp HelperDisplayAsCli): 4.x shows each test with its
// result and then each entity's ("GPU2: Pass") and warnings; 3.x each software check, then each
// test's result over the GPUs ("Pass - All"). A cell is filled as CommandOutputController fills a
// stencil's tag: padded to the tag's width, or cut with "..." when longer; messages are split
// into lines of 45 characters first (DisplayVerboseInfo).

const (
	diagHeader = "+---------------------------+------------------------------------------------+\n" +
		"| Diagnostic                | Result                                         |\n" +
		"+===========================+================================================+\n"
	diagInfo   = "|-----  Metadata  ----------+------------------------------------------------|\n"
	diagFooter = "+---------------------------+------------------------------------------------+\n"
	// The name tag "<DATA_NAME              >" and the info tag "<DATA_INFO ... >" of DIAG_DATA.
	diagNameWidth = 25
	diagInfoWidth = 46
	diagInfoLen   = 45 // DATA_INFO_TAG_LEN: how much of a message goes on one line
)

var diagCategoryBanners = map[string]string{
	"Deployment":  "|-----  Deployment  --------+------------------------------------------------|\n",
	"Hardware":    "+-----  Hardware  ----------+------------------------------------------------+\n",
	"Integration": "+-----  Integration  -------+------------------------------------------------+\n",
	"Stress":      "+-----  Stress  ------------+------------------------------------------------+\n",
}

// cell fills a tag of width w with s, as CommandOutputController::ReplaceTag does.
func cell(s string, w int) string {
	if len(s) > w {
		return s[:w-3] + "..."
	}
	return s + strings.Repeat(" ", w-len(s))
}

func diagRow(b *strings.Builder, name, info string) {
	fmt.Fprintf(b, "| %s | %s |\n", cell(name, diagNameWidth), cell(info, diagInfoWidth))
}

// diagMessage writes a message under name in lines of diagInfoLen characters.
func diagMessage(b *strings.Builder, name, msg string) {
	for pos := 0; pos < len(msg); pos += diagInfoLen {
		if pos > 0 {
			name = ""
		}
		diagRow(b, name, msg[pos:min(pos+diagInfoLen, len(msg))])
	}
}

func (r DCGMRun) text(tests []dcgmTest) []byte {
	var b strings.Builder
	b.WriteString("Successfully ran diagnostic for group.\n")
	b.WriteString(diagHeader)
	b.WriteString(diagInfo)
	diagRow(&b, "DCGM Version", r.Version)
	diagRow(&b, "Driver Version Detected", r.DriverVersion)
	diagRow(&b, "GPU Device IDs Detected", r.Device.DeviceID)
	if r.major() == 3 {
		r.text3(&b, tests)
	} else {
		r.text4(&b, tests)
	}
	b.WriteString(diagFooter)
	return []byte(b.String())
}

// byCategory calls row for each test, category by category in the order given, each category
// after its banner (a category without a test has none).
func byCategory(b *strings.Builder, order []string, tests []dcgmTest, row func(dcgmTest)) {
	for _, cat := range order {
		banner := false
		for _, t := range tests {
			if t.category != cat {
				continue
			}
			if !banner {
				b.WriteString(diagCategoryBanners[cat])
				banner = true
			}
			row(t)
		}
	}
}

func (r DCGMRun) text4(b *strings.Builder, tests []dcgmTest) {
	byCategory(b, []string{"Deployment", "Hardware", "Integration", "Stress"}, tests, func(t dcgmTest) {
		diagRow(b, t.name, t.result) // the test's own line shows a warning as "Warn"
		diagRow(b, "", fmt.Sprintf("GPU%d: %s", r.GPU, jsonResult(t.result)))
		for _, e := range t.errs {
			msg := e.msg
			if e.subtest != "" {
				msg = e.subtest + ": " + msg
			}
			diagMessage(b, fmt.Sprintf("Warning: GPU%d", r.GPU), msg)
		}
	})
}

func (r DCGMRun) text3(b *strings.Builder, tests []dcgmTest) {
	byCategory(b, []string{"Deployment", "Integration", "Hardware", "Stress"}, tests, func(t dcgmTest) {
		if t.name != "software" {
			diagRow(b, t.text3, t.result+" - All")
			for _, e := range t.errs {
				diagMessage(b, "Warning", e.msg)
			}
			return
		}
		for _, sub := range softwareSubtests {
			res := resPass
			if t.result == resSkip {
				res = resSkip
			}
			var errs []dcgmError
			for _, e := range t.errs {
				if e.subtest == sub {
					res, errs = jsonResult(t.result), append(errs, e)
				}
			}
			diagRow(b, sub, res)
			for _, e := range errs {
				diagMessage(b, "Error", e.msg)
			}
		}
	})
}

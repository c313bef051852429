package validation

import (
	"fmt"
	"strconv"
	"strings"
)

// Target names the GPU whose results count. DCGMID is DCGM's GPU id (entity_id in 4.x, gpu_id
// in 3.x); see the package documentation for how it relates to NVML's index.
type Target struct{ DCGMID int }

// ReadDCGM judges one GPU from a `dcgmi diag -j` run: its stdout (stderr appended is fine; text
// before and after the document is skipped) and exit code. Only the target GPU's results and
// results that name no entity (node-wide checks) count; the GPU passes only when at least one
// result naming it passed, none failed, and the exit code agrees with the document.
func ReadDCGM(output []byte, exitCode int, target Target) Verdict {
	docs, parseErr := findDocuments(output)
	v := judgeDCGM(docs, parseErr, output, exitCode, target)
	for _, d := range docs {
		if v.Version = docVersion(d); v.Version != "" {
			break
		}
	}
	return v
}

func judgeDCGM(docs []map[string]any, parseErr error, output []byte, exitCode int, target Target) Verdict {
	if exitCode < 0 {
		return errorf("dcgmi did not exit normally (killed by a signal or not run)")
	}
	var rtErr string
	for _, d := range docs {
		if rtErr = runtimeError(d); rtErr != "" {
			break
		}
	}
	if meaning, ok := infraExits[exitCode]; ok {
		if rtErr != "" {
			return errorf("dcgmi exited %d: %s: %q", exitCode, meaning, clip(rtErr, 600))
		}
		return errorf("dcgmi exited %d: %s", exitCode, meaning)
	}
	if rtErr != "" {
		return errorf("dcgmi diag could not run (exit %d): %q", exitCode, clip(rtErr, 800))
	}
	verdictExit := exitCode == exitOK || exitCode == exitNVVSError || exitCode == exitNVVSIsolate
	if parseErr != nil {
		if !verdictExit {
			return errorf("dcgmi exited %d%s: %s", exitCode, exitName(exitCode), firstLines(output, 3))
		}
		if exitCode != exitOK {
			return errorf("%s (exit %d)", parseErr, exitCode)
		}
		return errorf("%s", parseErr)
	}
	if !verdictExit {
		// Only 0, 226 and 205 carry a test verdict; a document beside any other code is
		// whatever dcgmi had printed before it gave up.
		return errorf("dcgmi exited %d%s, which is not a test verdict (only 0, 226 and 205 are)", exitCode, exitName(exitCode))
	}

	var iterations []map[string]any
	for _, d := range docs {
		if its, ok := d[keyIterations]; ok {
			for i, it := range asArray(its) {
				doc := asObject(it)
				if doc == nil {
					return errorf("iteration %d of the diag has no results", i+1)
				}
				iterations = append(iterations, doc)
			}
			continue
		}
		iterations = append(iterations, d)
	}
	if len(iterations) == 0 {
		return errorf("the diag's output holds no iteration")
	}
	t := tally{target: target, multi: len(iterations) > 1}
	for i, doc := range iterations {
		t.iteration = i + 1
		if diagSection(doc) == nil {
			return errorf("iteration %d is not a dcgmi diag document (no %q or %q)", i+1, keyDiag4, keyDiag3)
		}
		t.read(doc)
	}
	return t.verdict(exitCode)
}

// tally collects one GPU's findings over a run's iterations.
type tally struct {
	target    Target
	multi     bool // several iterations: findings say which
	iteration int

	tests, failures, warnings     []string
	unknown, badIDs               []string
	passed, skipped               []string // distinct test names, in order
	mine, minePassed, mineSkipped int      // results naming the target GPU
	failAnywhere                  bool     // a Fail in any result, any GPU
	iterationsWithoutPass         []int
}

type scope int

const (
	scopeOther scope = iota
	scopeMine
	scopeNode // names no entity: a node-wide check that applies to every GPU tested
	scopeBadID
)

func (t *tally) read(doc map[string]any) {
	minePass := false
	for _, c := range asArray(diagSection(doc)["test_categories"]) {
		for _, tv := range asArray(asObject(c)["tests"]) {
			test := asObject(tv)
			name, _ := asString(test["name"])
			if name == "" {
				name = "(unnamed test)"
			}
			if s, _ := asString(asObject(test["test_summary"])["status"]); isFail(s) {
				t.failAnywhere = true
			}
			for _, rv := range asArray(test["results"]) {
				if t.readResult(name, asObject(rv)) {
					minePass = true
				}
			}
		}
	}
	if !minePass {
		t.iterationsWithoutPass = append(t.iterationsWithoutPass, t.iteration)
	}
}

// readResult records one result and reports whether it is a pass naming the target GPU.
func (t *tally) readResult(test string, r map[string]any) bool {
	status, _ := asString(r["status"])
	if isFail(status) {
		t.failAnywhere = true
	}
	sc, id := t.scope(r)
	switch sc {
	case scopeOther:
		return false
	case scopeBadID:
		t.badIDs = append(t.badIDs, fmt.Sprintf("%s names GPU %q", test, id))
		return false
	case scopeMine:
		t.mine++
	}
	t.tests = append(t.tests, t.prefix()+test+": "+status)
	switch {
	case status == "Pass":
		t.passed = appendNew(t.passed, test)
		if sc == scopeMine {
			t.minePassed++
			return true
		}
	case status == "Skip" || status == "Not Run":
		t.skipped = appendNew(t.skipped, test)
		if sc == scopeMine {
			t.mineSkipped++
		}
	case isFail(status):
		findings, fault := readWarnings(r)
		if fault {
			msg := t.prefix() + test + ": " + status
			if len(findings) > 0 {
				msg += ": " + strings.Join(findings, "; ")
			} else {
				msg += " (DCGM gave no reason)"
			}
			t.failures = append(t.failures, msg)
		} else {
			for _, f := range findings {
				t.warnings = append(t.warnings, t.prefix()+test+": "+f)
			}
		}
	default:
		t.unknown = append(t.unknown, fmt.Sprintf("%s: %q", test, status))
	}
	return false
}

// scope says whose result r is. 4.x names an entity by entity_group_id (1 is GPU) or
// entity_group and entity_id; 3.x by gpu_id, a string in per-GPU results and a number (-1 for
// none) in deployment results. A result with none of these names no entity.
func (t *tally) scope(r map[string]any) (scope, string) {
	want := int64(t.target.DCGMID)
	if idv, ok := r["entity_id"]; ok {
		isGPU := false
		if g, ok := asInt(r["entity_group_id"]); ok {
			isGPU = g == 1
		} else if g, ok := asString(r["entity_group"]); ok {
			isGPU = g == "GPU"
		} else {
			// An entity id with no group: 4.x always writes both, so whose it is cannot be told.
			return scopeBadID, fmt.Sprint(idv)
		}
		id, ok := asInt(idv)
		switch {
		case !isGPU:
			return scopeOther, ""
		case !ok:
			return scopeBadID, fmt.Sprint(idv)
		case id == want:
			return scopeMine, ""
		}
		return scopeOther, ""
	}
	if idv, ok := r["gpu_id"]; ok {
		id, ok := asInt(idv)
		switch {
		case !ok:
			return scopeBadID, fmt.Sprint(idv)
		case id < 0:
			return scopeNode, ""
		case id == want:
			return scopeMine, ""
		}
		return scopeOther, ""
	}
	if _, ok := r["entity_group_id"]; ok {
		return scopeBadID, "(a group without an entity id)"
	}
	return scopeNode, ""
}

func (t *tally) prefix() string {
	if t.multi {
		return "iteration " + strconv.Itoa(t.iteration) + ": "
	}
	return ""
}

func (t *tally) verdict(exitCode int) Verdict {
	gpu := t.target.DCGMID
	v := Verdict{Tests: t.tests, Warnings: t.warnings}
	switch {
	case len(t.failures) > 0 && exitCode == exitOK:
		v.Result = Error
		v.Message = fmt.Sprintf("dcgmi exited 0 but the document shows a failure on GPU %d: %s",
			gpu, strings.Join(t.failures, "; "))
	case len(t.failures) > 0:
		v.Result = Failed
		v.Message = strings.Join(t.failures, "; ")
	case len(t.unknown) > 0:
		v.Result = Error
		v.Message = "unknown test status " + strings.Join(t.unknown, ", ")
	case len(t.badIDs) > 0:
		v.Result = Error
		v.Message = "cannot tell which GPU a result is for: " + strings.Join(t.badIDs, ", ")
	case exitCode != exitOK && !t.failAnywhere:
		v.Result = Error
		v.Message = fmt.Sprintf("exit %d says a test failed but the document shows none", exitCode)
	case t.mine == 0:
		v.Result = Error
		v.Message = fmt.Sprintf("no result for GPU %d in the diag's output", gpu)
	case t.mineSkipped == t.mine:
		v.Result = Error
		v.Message = fmt.Sprintf("no test ran on GPU %d: every result for it was skipped (%s)", gpu, strings.Join(t.skipped, ", "))
	case t.minePassed == 0:
		v.Result = Error
		v.Message = fmt.Sprintf("no test passed on GPU %d: its results were skipped or only warned", gpu)
	case len(t.iterationsWithoutPass) > 0:
		v.Result = Error
		v.Message = fmt.Sprintf("no test passed on GPU %d in iteration %d", gpu, t.iterationsWithoutPass[0])
	default:
		v.Result = Passed
		v.Message = t.summary()
	}
	v.Message = clip(v.Message, maxMessage)
	return v
}

func (t *tally) summary() string {
	noun := "tests"
	if len(t.passed) == 1 {
		noun = "test"
	}
	s := fmt.Sprintf("%d %s passed: %s", len(t.passed), noun, strings.Join(t.passed, ", "))
	if t.multi {
		s += fmt.Sprintf(" (%d iterations)", t.iteration)
	}
	if len(t.skipped) > 0 {
		s += "; skipped: " + strings.Join(t.skipped, ", ")
	}
	if n := len(t.warnings); n == 1 {
		s += "; 1 warning"
	} else if n > 1 {
		s += fmt.Sprintf("; %d warnings", n)
	}
	return s
}

// isFail: dcgmi prints a WARN result as "Fail" in JSON; its plain-text "Warn" is judged alike.
func isFail(status string) bool { return status == "Fail" || status == "Warn" }

// readWarnings renders a failed result's warnings and reports whether they make a fault: a
// Fail without warnings, or with any warning whose severity is unknown or not MONITOR/CONFIG.
func readWarnings(r map[string]any) (findings []string, fault bool) {
	ws := asArray(r["warnings"])
	if len(ws) == 0 {
		if s, ok := asString(r["warnings"]); ok && s != "" {
			ws = []any{s}
		}
	}
	if len(ws) == 0 {
		return nil, true
	}
	for _, w := range ws {
		text, id, sev, sevKnown := readWarning(w)
		f := strconv.Quote(clip(text, 300))
		switch {
		case id != "" && sevKnown:
			f += fmt.Sprintf(" (DCGM error %s, severity %s)", id, severityName(sev))
		case id != "":
			f += fmt.Sprintf(" (DCGM error %s, severity unknown)", id)
		case sevKnown:
			f += fmt.Sprintf(" (severity %s)", severityName(sev))
		default:
			f += " (severity unknown)"
		}
		findings = append(findings, f)
		if !sevKnown || !notFaults[sev] {
			fault = true
		}
	}
	return findings, fault
}

// readWarning reads one warning: 4.x and 3.x per-GPU results write {"warning": text, ...}; 3.x
// deployment results write the text under "warnings"; older 3.x builds wrote a plain string,
// whose severity is unknown.
func readWarning(w any) (text, id string, sev int64, sevKnown bool) {
	if s, ok := asString(w); ok {
		return s, "", 0, false
	}
	o := asObject(w)
	if o == nil {
		return fmt.Sprint(w), "", 0, false
	}
	text, ok := asString(o["warning"])
	if !ok {
		text, _ = asString(o["warnings"])
	}
	if n, ok := asInt(o["error_id"]); ok {
		id = strconv.FormatInt(n, 10)
	}
	sev, sevKnown = asInt(o["error_severity"])
	return text, id, sev, sevKnown
}

func appendNew(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}
	return append(list, s)
}

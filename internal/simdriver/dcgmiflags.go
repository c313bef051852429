package simdriver

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// dcgmi's command line as TCLAP and dcgmi's own checks read it: the options, the errors in
// their words, the run level and the one GPU asked for.

// dcgmiOpt is one of a subsystem's options: TCLAP's short and long names, and whether it takes
// a value.
type dcgmiOpt struct {
	short, long string
	value       bool
}

// diagOpts are dcgmi diag's options (ProcessDiagCommandLine). 3.x names -i --gpuList.
func diagOpts(major int) []dcgmiOpt {
	entity := dcgmiOpt{"i", "entity-id", true}
	gpuList := dcgmiOpt{"", "gpuList", true}
	if major == 3 {
		entity, gpuList = dcgmiOpt{"i", "gpuList", true}, dcgmiOpt{}
	}
	return []dcgmiOpt{{"r", "run", true}, {"g", "group", true}, {"", "host", true}, {"p", "parameters", true},
		{"c", "configfile", true}, {"f", "fakeGpuList", true}, gpuList, {"n", "expectedNumEntities", true},
		{"v", "verbose", false}, {"", "statsonfail", false}, {"", "debugLogFile", true}, {"", "statspath", true},
		{"d", "debugLevel", true}, {"j", "json", false}, {"", "train", false}, {"", "throttle-mask", true},
		{"", "clocksevent-mask", true}, {"", "fail-early", false}, {"", "check-interval", true},
		{"", "iterations", true}, entity, {"t", "timeout", true}, {"", "watch-frequency", true},
		{"", "ignoreErrorCodes", true}, {"h", "help", false}}
}

// usageError is a command line TCLAP refuses: dcgmi prints "Error: <msg>[ for arg <arg>]." and
// main's "An error occurred ..." on stderr, and exits -2.
type usageError struct{ msg, arg string }

func (e usageError) print(stderr io.Writer) int {
	fmt.Fprint(stderr, "Error: "+e.msg)
	if e.arg != "" {
		fmt.Fprint(stderr, " for arg "+e.arg)
	}
	fmt.Fprint(stderr, ".\nAn error occurred trying to parse the command line.\n")
	return sim.DCGMExitUsage
}

// parseOpts parses args as TCLAP does: -x VALUE, --long VALUE, --long=VALUE and switches; every
// option once, but -p (a MultiArg) any number of times. Values are keyed by the long name.
func parseOpts(opts []dcgmiOpt, args []string) (map[string][]string, *usageError) {
	got := map[string][]string{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, inline := strings.Cut(a, "=")
		var opt *dcgmiOpt
		for j := range opts {
			o := &opts[j]
			if (o.short != "" && !inline && a == "-"+o.short) || (o.long != "" && name == "--"+o.long) {
				opt = o
			}
		}
		if opt == nil {
			return nil, &usageError{"Couldn't find match for argument", a}
		}
		if _, dup := got[opt.long]; dup && opt.long != "parameters" {
			return nil, &usageError{"Argument already set!", a}
		}
		switch {
		case !opt.value && inline:
			return nil, &usageError{"Couldn't find match for argument", a}
		case !opt.value:
			value = "true"
		case !inline:
			if i+1 == len(args) {
				return nil, &usageError{"Missing a value for this argument!", a}
			}
			i++
			value = args[i]
		}
		got[opt.long] = append(got[opt.long], value)
	}
	return got, nil
}

func optValue(got map[string][]string, long, def string) string {
	if v := got[long]; len(v) > 0 {
		return v[len(v)-1]
	}
	return def
}

// diagLevelAndTimeout checks -r, -t and the options the simulated dcgmi does not run.
func diagLevelAndTimeout(got map[string][]string, major int) (int, uint32, *usageError) {
	if len(got["train"]) > 0 {
		return 0, 0, &usageError{"Specifying training is no longer supported and this code has been removed.", ""}
	}
	for _, long := range []string{"group", "iterations", "check-interval", "watch-frequency", "timeout"} {
		if v, ok := got[long]; ok {
			if _, err := strconv.ParseUint(v[len(v)-1], 10, 32); err != nil {
				return 0, 0, &usageError{fmt.Sprintf("Couldn't read argument value from string '%s'", v[len(v)-1]), long}
			}
		}
	}
	if optValue(got, "iterations", "1") == "0" {
		return 0, 0, &usageError{"The value for iterations cannot be 0.", ""}
	}
	if n := optValue(got, "iterations", "1"); n != "1" {
		return 0, 0, &usageError{"--iterations " + n + ": the simulated dcgmi runs one iteration", ""}
	}
	if len(got["fakeGpuList"]) > 0 {
		return 0, 0, &usageError{"the simulated dcgmi diagnoses simulated GPUs, not fake ones", "fakeGpuList"}
	}
	r := optValue(got, "run", "1")
	if strings.HasPrefix(r, "-") {
		return 0, 0, &usageError{"Positive value expected, negative value found", "run"}
	}
	levels := map[string]int{"1": 1, "2": 2, "3": 3, "4": 4}
	if major == 4 {
		// 4.x's names of the levels.
		for w, l := range map[string]int{"quick": 1, "short": 1, "medium": 2, "long": 3, "xlong": 4} {
			levels[w] = l
		}
	}
	level, ok := levels[strings.ToLower(r)]
	if !ok {
		// dcgm_diag_common_populate_run_diag's words (4.x would run tests by name; the
		// simulation runs levels).
		return 0, 0, &usageError{fmt.Sprintf("Invalid value '%s' specified for -r.", r), ""}
	}
	t, _ := strconv.ParseUint(optValue(got, "timeout", "0"), 10, 32)
	return level, uint32(t), nil
}

// diagEntities returns the entity list (-i) and checks what TCLAP and the option checks refuse.
func diagEntities(got map[string][]string, major int, entityOpt string) (string, *usageError) {
	_, group := got["group"]
	_, entity := got[entityOpt]
	_, gpuList := got["gpuList"]
	switch {
	case major == 4 && gpuList && entity:
		return "", &usageError{"Specifying a entity id and a gpu list are mutually exclusive", ""}
	case group && (entity || gpuList):
		return "", &usageError{"Specifying a group id and a entity id are mutually exclusive", ""}
	}
	list := optValue(got, entityOpt, "")
	if major == 4 && gpuList {
		list = optValue(got, "gpuList", "")
	}
	if (major == 3 || gpuList) && strings.Trim(list, "0123456789,") != "" {
		return "", &usageError{fmt.Sprintf("Invalid gpu list '%s'. The list must be a comma-separated list of numbers only.", list), ""}
	}
	if group || list == "" {
		if major == 3 {
			return "", nil
		}
		return "*,cpu:*", nil // 4.x's default: every GPU and CPU
	}
	return list, nil
}

// parseEntity finds the one GPU the entity list names, or says why the list is refused, in
// EntityListWithMigAndUuidParser's words (RunDiagOnce prefixes "Error: "). A GPU may be named by
// its UUID too.
func parseEntity(ctx context.Context, socket, list string, major int) (int, string) {
	one := "Error: the simulated dcgmi diagnoses one GPU at a time (-i gpu:ID), not " + strconv.Quote(list)
	if list == "" || strings.Contains(list, ",") {
		return 0, one
	}
	id := list
	if major == 4 {
		if typ, rest, ok := strings.Cut(list, ":"); ok {
			switch t := strings.ToLower(typ); {
			case t == "" || !strings.ContainsRune("gnvicl", rune(t[0])):
				return 0, "Error: Error: invalid entity type: " + list
			case t[0] != 'g':
				return 0, "Error: Unsupported entities are indicated."
			}
			id = rest
		}
		if strings.HasPrefix(strings.ToUpper(id), "GPU-") {
			var d discoveryReply
			if err := ask(ctx, socket, &request{Op: opDiscovery}, nil, &d); err == nil {
				for i, g := range d.GPUs {
					if strings.EqualFold(g.UUID, id) {
						return i, ""
					}
				}
			}
			return 0, "Error: Error: Expected numerical entityId instead of " + id
		}
		switch {
		case id == "":
			return 0, "Error: Error: empty entityId detected in " + id
		case id == "*" || strings.HasPrefix(id, "{"):
			return 0, one
		}
	}
	if id == "" || strings.Trim(id, "0123456789") != "" {
		return 0, "Error: Error: Expected numerical entityId instead of " + id
	}
	n, err := strconv.Atoi(id)
	if err != nil {
		return 0, "Error: Error: Expected numerical entityId instead of " + id
	}
	return n, ""
}

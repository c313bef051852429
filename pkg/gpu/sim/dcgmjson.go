package sim

import "strconv"

// The -j documents of DCGM 4.x and 3.x, built as jsoncpp values (jsoncpp.go) from a run's tests.

// jsonResult is HelperDisplayDiagResult without DDR_DISPLAY_WARN: a warning reads "Fail".
func jsonResult(res string) string {
	if res == resWarn {
		return resFail
	}
	return res
}

// json4 is 4.x's document: results per entity (the GPU, entity group 1), a test_summary per
// test, the entity list and the versions under metadata.
func (r DCGMRun) json4(tests []dcgmTest) jobj {
	categories := jsonByCategory([]string{"Deployment", "Hardware", "Integration", "Stress"}, tests, func(t dcgmTest) jarr {
		res := jobj{"entity_group": "GPU", "entity_group_id": 1, "entity_id": r.GPU, "status": jsonResult(t.result)}
		if len(t.errs) > 0 {
			var ws jarr
			for _, e := range t.errs {
				msg := e.msg
				if e.subtest != "" {
					msg = e.subtest + ": " + msg // the software plugin names its check
				}
				ws = append(ws, e.warning("warning", msg))
			}
			res["warnings"] = ws
		}
		return jarr{jobj{"name": t.name, "results": jarr{res}, "test_summary": jobj{"status": jsonResult(t.result)}}}
	})
	entity := jobj{"device_id": r.Device.DeviceID, "entity_id": r.GPU}
	if r.Device.Serial != "" {
		entity["serial_num"] = r.Device.Serial
	}
	meta := jobj{"version": r.Version}
	if r.DriverVersion != "" {
		meta["Driver Version Detected"] = r.DriverVersion
	}
	return jobj{
		"DCGM Diagnostic": jobj{"test_categories": categories},
		"entity_groups":   jarr{jobj{"entities": jarr{entity}, "entity_group": "GPU", "entity_group_id": 1}},
		"metadata":        meta,
	}
}

// json3 is 3.x's document (v3.3.9 HelperJsonBuildOutput): the software subtests as Deployment
// tests with one result each, without gpu_id unless an error names the GPU (then a number, and
// the message under "warnings": 3.x's own spelling there); the other tests per GPU with gpu_id a
// string; categories Deployment, Integration, Hardware, Stress; versions and device IDs at the
// top level.
func (r DCGMRun) json3(tests []dcgmTest) jobj {
	categories := jsonByCategory([]string{"Deployment", "Integration", "Hardware", "Stress"}, tests, func(t dcgmTest) jarr {
		if t.name == "software" {
			return r.software3(t)
		}
		res := jobj{"gpu_id": strconv.Itoa(r.GPU), "status": jsonResult(t.result)}
		if len(t.errs) > 0 {
			var ws jarr
			for _, e := range t.errs {
				ws = append(ws, e.warning("warning", e.msg))
			}
			res["warnings"] = ws
		}
		return jarr{jobj{"name": t.name3, "results": jarr{res}}}
	})
	doc := jobj{
		"DCGM GPU Diagnostic":     jobj{"test_categories": categories},
		"version":                 r.Version,
		"Driver Version Detected": r.DriverVersion,
		"GPU Device IDs":          jarr{r.Device.DeviceID},
	}
	if r.Device.Serial != "" {
		doc["GPU Device Serials"] = jobj{strconv.Itoa(r.GPU): r.Device.Serial}
	}
	return doc
}

// software3 is 3.x's software plugin: one Deployment test per subtest, each with one result.
func (r DCGMRun) software3(t dcgmTest) jarr {
	var ts jarr
	for _, sub := range softwareSubtests {
		res := jobj{"status": resPass}
		if t.result == resSkip {
			res["status"] = resSkip
		}
		var ws jarr
		for _, e := range t.errs {
			if e.subtest == sub {
				res["status"], res["gpu_id"] = jsonResult(t.result), r.GPU
				ws = append(ws, e.warning("warnings", e.msg)) // 3.x's own spelling here
			}
		}
		if len(ws) > 0 {
			res["warnings"] = ws
		}
		ts = append(ts, jobj{"name": sub, "results": jarr{res}})
	}
	return ts
}

// jsonByCategory groups the documents entries makes of each test under their categories, in
// order; a category without tests is left out.
func jsonByCategory(order []string, tests []dcgmTest, entries func(dcgmTest) jarr) jarr {
	var categories jarr
	for _, cat := range order {
		var ts jarr
		for _, t := range tests {
			if t.category == cat {
				ts = append(ts, entries(t)...)
			}
		}
		if len(ts) > 0 {
			categories = append(categories, jobj{"category": cat, "tests": ts})
		}
	}
	return categories
}

// warning is the error's entry in a result's warnings, its message under key ("warning"; 3.x's
// software subtests spell it "warnings").
func (e dcgmError) warning(key, msg string) jobj {
	return jobj{key: msg, "error_id": e.code, "error_category": e.category, "error_severity": e.severity}
}

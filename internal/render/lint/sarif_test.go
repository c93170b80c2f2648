package lint

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"fp16audit/internal/golden"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"fp16audit/checks"
)

var update = flag.Bool("update", false, "rewrite testdata/lint.sarif.golden")

var sarifRules = []*checks.Check{
	{ID: "FP4003", Title: "explicit half cast in the graph", Severity: checks.SevWarning, Doc: "The graph casts to fp16 itself."},
	{ID: "FP4004", Title: "constant beyond the fp16 range", Severity: checks.SevError, Doc: "A constant holds |x| > 65504."},
	{ID: "FP4005", Title: "normalization epsilon vanishes in fp16", Severity: checks.SevError, Doc: "eps < 2^-24.", Policies: []string{"autocast-fp16", "half"}},
	{ID: "FP4007", Title: "ir or opset version onnx runtime cannot load", Severity: checks.SevError, Doc: "IR > 13."},
}

func sarifSample() sarifInput {
	return sarifInput{
		Tool: "fp16audit", Version: "0.2.0", Rules: sarifRules,
		Models: []sarifModel{
			{Path: "models/bert base.onnx", Findings: []checks.Finding{
				{Check: "FP4004", Severity: checks.SevError, Title: "constant beyond the fp16 range", Message: `constant "mask" holds -1e+09, read by node "/attn/Add" (module encoder.layer.0.attention): it is held in fp16 there under half`,
					Node: "/encoder/layer.0/attention/Add", Module: "encoder.layer.0.attention", Value: "mask"},
				{Check: "FP4003", Severity: checks.SevWarning, Title: "explicit half cast in the graph", Message: `node "/Cast" casts "x" to FLOAT16 itself`, Node: "/Cast", Value: "x"},
				{Check: "FP4005", Severity: checks.SevInfo, Title: "normalization epsilon vanishes in fp16", Message: "info <&> finding", Node: "LayerNormalization#3", Value: "epsilon=1e-12"},
				{Check: "FP4007", Severity: checks.SevError, Message: "the model has IR version 14", Value: "ir_version=14"},
			}},
			{Path: "clean.onnx", Findings: nil},
			{Path: "broken.onnx", Err: "load model broken.onnx: file is empty"},
		},
	}
}

func TestSARIFGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := writeSARIF(&buf, sarifSample()); err != nil {
		t.Fatal(err)
	}
	validateSARIF(t, buf.Bytes())
	golden.Check(t, filepath.Join("testdata", "lint.sarif.golden"), buf.Bytes(), *update, "go test ./internal/render/lint -update")
}

func TestSARIFContent(t *testing.T) {
	var buf bytes.Buffer
	if err := writeSARIF(&buf, sarifSample()); err != nil {
		t.Fatal(err)
	}
	var log struct {
		Runs []struct {
			Tool struct {
				Driver struct {
					Rules []struct {
						ID, Name             string
						DefaultConfiguration struct{ Level string }
					}
				}
			}
			Invocations []struct {
				ExecutionSuccessful        bool
				ToolExecutionNotifications []struct{ Message struct{ Text string } }
			}
			Results []struct {
				RuleID    string
				RuleIndex int
				Level     string
				Locations []struct {
					PhysicalLocation struct{ ArtifactLocation struct{ URI string } }
					LogicalLocations []struct{ Name, FullyQualifiedName, Kind string }
				}
			}
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &log); err != nil {
		t.Fatal(err)
	}
	run := log.Runs[0]
	if r := run.Tool.Driver.Rules[0]; r.ID != "FP4003" || r.Name != "ExplicitHalfCastInTheGraph" || r.DefaultConfiguration.Level != "warning" {
		t.Errorf("rule 0: %+v", r)
	}
	if len(run.Results) != 4 {
		t.Fatalf("got %d results, want 4", len(run.Results))
	}
	r0 := run.Results[0]
	loc := r0.Locations[0]
	if r0.RuleID != "FP4004" || r0.RuleIndex != 1 || r0.Level != "error" || loc.PhysicalLocation.ArtifactLocation.URI != "models/bert%20base.onnx" {
		t.Errorf("result 0: %+v", r0)
	}
	if ll := loc.LogicalLocations; len(ll) != 1 || ll[0].Name != "/encoder/layer.0/attention/Add" || ll[0].FullyQualifiedName != "encoder.layer.0.attention" || ll[0].Kind != "member" {
		t.Errorf("result 0 logical location: %+v", ll)
	}
	if ll := run.Results[1].Locations[0].LogicalLocations; ll[0].FullyQualifiedName != "/Cast" {
		t.Errorf("a node without module path: fullyQualifiedName %q, want the node", ll[0].FullyQualifiedName)
	}
	if run.Results[2].Level != "note" {
		t.Errorf("info maps to %q, want note", run.Results[2].Level)
	}
	if len(run.Results[3].Locations[0].LogicalLocations) != 0 {
		t.Error("a model-level finding has a logical location")
	}
	inv := run.Invocations[0]
	if inv.ExecutionSuccessful || len(inv.ToolExecutionNotifications) != 1 || !strings.Contains(inv.ToolExecutionNotifications[0].Message.Text, "file is empty") {
		t.Errorf("invocation: %+v", inv)
	}
}

func TestSARIFEmpty(t *testing.T) {
	var buf bytes.Buffer
	if err := writeSARIF(&buf, sarifInput{Tool: "fp16audit"}); err != nil {
		t.Fatal(err)
	}
	validateSARIF(t, buf.Bytes())
	if !strings.Contains(buf.String(), `"results": []`) || !strings.Contains(buf.String(), `"executionSuccessful": true`) {
		t.Errorf("empty log:\n%s", buf.String())
	}
}

// TestSARIFValidator makes sure the validator rejects what the schema
// rejects: each edit of a valid log must produce the named problem.
func TestSARIFValidator(t *testing.T) {
	var buf bytes.Buffer
	if err := writeSARIF(&buf, sarifSample()); err != nil {
		t.Fatal(err)
	}
	good := buf.String()
	for _, tc := range []struct{ old, new, want string }{
		{`"version": "2.1.0"`, `"version": "2.0.0"`, "want \"2.1.0\""},
		{`"$schema": "https://json.schemastore.org/sarif-2.1.0.json",`, ``, "$schema"},
		{`"name": "fp16audit"`, `"name": ""`, "driver.name"},
		{`"level": "error"`, `"level": "info"`, "is not one of"},
		{`"ruleIndex": 1`, `"ruleIndex": 0`, "names rule FP4003, not ruleId FP4004"},
		{`"ruleIndex": 1`, `"ruleIndex": 9`, "not an index"},
		{`"uri": "clean.onnx"`, `"uri": "clean model.onnx"`, "percent-encoded"},
		{`"kind": "member"`, `"kind": "node"`, "not a kind"},
		{`"executionSuccessful": false`, `"executionSuccessful": "no"`, "want a boolean"},
		{`"message": {
            "text": "info <&> finding"
          }`, `"message": {}`, "missing required property \"text\""},
		{`"ruleId": "FP4003",`, `"ruleId": "FP4003", "severity": "warning",`, "not allowed"},
	} {
		bad := strings.Replace(good, tc.old, tc.new, 1)
		if bad == good {
			t.Fatalf("edit %q not applied", tc.old)
		}
		problems := strings.Join(sarifProblems([]byte(bad)), "\n")
		if !strings.Contains(problems, tc.want) {
			t.Errorf("after %q -> %q: problems %q lack %q", tc.old, tc.new, problems, tc.want)
		}
	}
}

func TestFileURI(t *testing.T) {
	for in, want := range map[string]string{
		"model.onnx":          "model.onnx",
		"./models/../m.onnx":  "m.onnx",
		"models/a b#1.onnx":   "models/a%20b%231.onnx",
		"/abs/models/m.onnx":  "file:///abs/models/m.onnx",
		"c:model.onnx":        "./c:model.onnx",
		"models/ünïcode.onnx": "models/%C3%BCn%C3%AFcode.onnx",
	} {
		if got := fileURI(in); got != want {
			t.Errorf("fileURI(%q) = %q, want %q", in, got, want)
		}
		if err := checkURIReference(fileURI(in)); err != nil {
			t.Errorf("fileURI(%q): %v", in, err)
		}
	}
}

// validateSARIF checks a log against the requirements of the SARIF 2.1.0
// schema (sarif-schema-2.1.0.json, OASIS) for every object fp16audit
// writes: required properties, property types, the closed sets of
// properties of objects whose schema forbids additional ones, the level
// and kind enumerations, URI references, and the consistency of ruleIndex
// and artifact indexes with the arrays they point into (which the
// specification requires and the schema cannot express).
func validateSARIF(t *testing.T, data []byte) {
	t.Helper()
	for _, p := range sarifProblems(data) {
		t.Errorf("SARIF: %s", p)
	}
}

// sarifProblems returns what validateSARIF objects to.
func sarifProblems(data []byte) []string {
	var doc map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return []string{fmt.Sprintf("not JSON: %v", err)}
	}
	v := &sarifValidator{}
	v.object("sarifLog", doc, []string{"version", "runs"}, []string{"$schema", "version", "runs", "inlineExternalProperties", "properties"})
	if doc["version"] != "2.1.0" {
		v.errorf("sarifLog.version = %v, want \"2.1.0\"", doc["version"])
	}
	if s, ok := doc["$schema"].(string); !ok {
		v.errorf("sarifLog.$schema: want a URI string")
	} else if u, err := url.Parse(s); err != nil || !u.IsAbs() {
		v.errorf("sarifLog.$schema %q: want an absolute URI", s)
	}
	runs := v.array("sarifLog.runs", doc["runs"])
	for ri, r := range runs {
		v.run(fmt.Sprintf("runs[%d]", ri), r)
	}
	return v.problems
}

type sarifValidator struct {
	problems []string
}

func (v *sarifValidator) errorf(format string, args ...any) {
	v.problems = append(v.problems, fmt.Sprintf(format, args...))
}

// object checks that x is an object with the required properties and, when
// allowed is not nil, no others; it returns the object.
func (v *sarifValidator) object(where string, x any, required, allowed []string) map[string]any {
	m, ok := x.(map[string]any)
	if !ok {
		v.errorf("%s: want an object, got %T", where, x)
		return map[string]any{}
	}
	for _, k := range required {
		if _, ok := m[k]; !ok {
			v.errorf("%s: missing required property %q", where, k)
		}
	}
	if allowed != nil {
		for k := range m {
			if !slices.Contains(allowed, k) {
				v.errorf("%s: property %q is not allowed by the schema", where, k)
			}
		}
	}
	return m
}

func (v *sarifValidator) array(where string, x any) []any {
	a, ok := x.([]any)
	if !ok {
		v.errorf("%s: want an array, got %T", where, x)
	}
	return a
}

func (v *sarifValidator) str(where string, x any, nonEmpty bool) string {
	s, ok := x.(string)
	if !ok || nonEmpty && s == "" {
		v.errorf("%s: want a non-empty string, got %#v", where, x)
	}
	return s
}

func (v *sarifValidator) index(where string, x any, n int) int {
	num, ok := x.(json.Number)
	i, err := num.Int64()
	if !ok || err != nil || i < -1 || i >= int64(n) {
		v.errorf("%s: %v is not an index into an array of %d", where, x, n)
		return -1
	}
	return int(i)
}

// message checks a message or multiformatMessageString: text is required
// (the schema also allows id or markdown alone; fp16audit always writes
// text).
func (v *sarifValidator) message(where string, x any) {
	m := v.object(where, x, []string{"text"}, []string{"text", "markdown", "id", "arguments", "properties"})
	v.str(where+".text", m["text"], true)
}

var sarifLevels = []string{"none", "note", "warning", "error"}

func (v *sarifValidator) level(where string, x any) {
	if s, ok := x.(string); !ok || !slices.Contains(sarifLevels, s) {
		v.errorf("%s: level %#v is not one of %v", where, x, sarifLevels)
	}
}

var logicalKinds = []string{"function", "member", "module", "namespace", "parameter", "resource",
	"returnType", "type", "variable", "object", "array", "property", "value", "element", "text",
	"attribute", "comment", "declaration", "dtd", "processingInstruction"}

func (v *sarifValidator) run(where string, x any) {
	r := v.object(where, x, []string{"tool"}, nil)
	tool := v.object(where+".tool", r["tool"], []string{"driver"}, []string{"driver", "extensions", "properties"})
	drv := v.object(where+".tool.driver", tool["driver"], []string{"name"}, nil)
	v.str(where+".tool.driver.name", drv["name"], true)
	var ruleIDs []string
	if rules, ok := drv["rules"]; ok {
		for i, x := range v.array(where+".tool.driver.rules", rules) {
			rw := fmt.Sprintf("%s.tool.driver.rules[%d]", where, i)
			rule := v.object(rw, x, []string{"id"}, []string{"id", "deprecatedIds", "guid", "deprecatedGuids", "name", "deprecatedNames",
				"shortDescription", "fullDescription", "messageStrings", "defaultConfiguration", "helpUri", "help", "relationships", "properties"})
			id := v.str(rw+".id", rule["id"], true)
			if slices.Contains(ruleIDs, id) {
				v.errorf("%s: duplicate rule id %s", rw, id)
			}
			ruleIDs = append(ruleIDs, id)
			for _, k := range []string{"shortDescription", "fullDescription", "help"} {
				if d, ok := rule[k]; ok {
					v.message(rw+"."+k, d)
				}
			}
			if c, ok := rule["defaultConfiguration"]; ok {
				cfg := v.object(rw+".defaultConfiguration", c, nil, []string{"enabled", "level", "rank", "parameters", "properties"})
				if l, ok := cfg["level"]; ok {
					v.level(rw+".defaultConfiguration.level", l)
				}
			}
			if p, ok := rule["properties"]; ok {
				v.object(rw+".properties", p, nil, nil)
			}
		}
	}
	var artifactURIs []string
	if arts, ok := r["artifacts"]; ok {
		for i, x := range v.array(where+".artifacts", arts) {
			aw := fmt.Sprintf("%s.artifacts[%d]", where, i)
			a := v.object(aw, x, nil, nil)
			loc := v.object(aw+".location", a["location"], nil, []string{"uri", "uriBaseId", "index", "description", "properties"})
			u := v.str(aw+".location.uri", loc["uri"], true)
			if err := checkURIReference(u); err != nil {
				v.errorf("%s.location.uri: %v", aw, err)
			}
			artifactURIs = append(artifactURIs, u)
		}
	}
	artifactLocation := func(w string, x any) {
		al := v.object(w, x, nil, []string{"uri", "uriBaseId", "index", "description", "properties"})
		u := v.str(w+".uri", al["uri"], true)
		if err := checkURIReference(u); err != nil {
			v.errorf("%s.uri: %v", w, err)
		}
		if ix, ok := al["index"]; ok {
			if i := v.index(w+".index", ix, len(artifactURIs)); i >= 0 && artifactURIs[i] != u {
				v.errorf("%s: index %d names artifact %q, not %q", w, i, artifactURIs[i], u)
			}
		}
	}
	location := func(w string, x any) {
		loc := v.object(w, x, nil, []string{"id", "physicalLocation", "logicalLocations", "message", "annotations", "relationships", "properties"})
		if p, ok := loc["physicalLocation"]; ok {
			pl := v.object(w+".physicalLocation", p, nil, []string{"address", "artifactLocation", "region", "contextRegion", "properties"})
			if _, ok := pl["artifactLocation"]; !ok {
				v.errorf("%s.physicalLocation: needs artifactLocation or address", w)
			} else {
				artifactLocation(w+".physicalLocation.artifactLocation", pl["artifactLocation"])
			}
		}
		if lls, ok := loc["logicalLocations"]; ok {
			for i, x := range v.array(w+".logicalLocations", lls) {
				lw := fmt.Sprintf("%s.logicalLocations[%d]", w, i)
				ll := v.object(lw, x, nil, []string{"name", "index", "fullyQualifiedName", "decoratedName", "parentIndex", "kind", "properties"})
				v.str(lw+".name", ll["name"], true)
				v.str(lw+".fullyQualifiedName", ll["fullyQualifiedName"], true)
				if k, ok := ll["kind"]; ok && !slices.Contains(logicalKinds, v.str(lw+".kind", k, true)) {
					v.errorf("%s.kind %v is not a kind SARIF defines", lw, k)
				}
			}
		}
	}
	if invs, ok := r["invocations"]; ok {
		for i, x := range v.array(where+".invocations", invs) {
			iw := fmt.Sprintf("%s.invocations[%d]", where, i)
			inv := v.object(iw, x, []string{"executionSuccessful"}, nil)
			if _, ok := inv["executionSuccessful"].(bool); !ok {
				v.errorf("%s.executionSuccessful: want a boolean", iw)
			}
			if ns, ok := inv["toolExecutionNotifications"]; ok {
				for j, x := range v.array(iw+".toolExecutionNotifications", ns) {
					nw := fmt.Sprintf("%s.toolExecutionNotifications[%d]", iw, j)
					n := v.object(nw, x, []string{"message"}, []string{"locations", "message", "level", "threadId", "timeUtc", "exception", "descriptor", "associatedRule", "properties"})
					v.message(nw+".message", n["message"])
					if l, ok := n["level"]; ok {
						v.level(nw+".level", l)
					}
					if locs, ok := n["locations"]; ok {
						for k, x := range v.array(nw+".locations", locs) {
							location(fmt.Sprintf("%s.locations[%d]", nw, k), x)
						}
					}
				}
			}
		}
	}
	if res, ok := r["results"]; ok {
		for i, x := range v.array(where+".results", res) {
			rw := fmt.Sprintf("%s.results[%d]", where, i)
			res := v.object(rw, x, []string{"message"}, []string{"guid", "correlationGuid", "ruleId", "ruleIndex", "rule", "kind", "level",
				"message", "analysisTarget", "locations", "hostedViewerUri", "partialFingerprints", "fingerprints", "stacks", "codeFlows",
				"graphs", "graphTraversals", "relatedLocations", "suppressions", "baselineState", "rank", "attachments", "workItemUris",
				"provenance", "fixes", "taxa", "webRequest", "webResponse", "properties"})
			v.message(rw+".message", res["message"])
			if l, ok := res["level"]; ok {
				v.level(rw+".level", l)
			}
			id, hasID := res["ruleId"].(string)
			if ix, ok := res["ruleIndex"]; ok {
				if j := v.index(rw+".ruleIndex", ix, len(ruleIDs)); j >= 0 && hasID && ruleIDs[j] != id {
					v.errorf("%s: ruleIndex %d names rule %s, not ruleId %s", rw, j, ruleIDs[j], id)
				}
			} else if hasID && slices.Contains(ruleIDs, id) {
				v.errorf("%s: ruleId %s is a rule of the driver but ruleIndex is missing", rw, id)
			}
			if !hasID {
				v.errorf("%s: no ruleId", rw)
			}
			if locs, ok := res["locations"]; ok {
				for k, x := range v.array(rw+".locations", locs) {
					location(fmt.Sprintf("%s.locations[%d]", rw, k), x)
				}
			}
			if p, ok := res["properties"]; ok {
				v.object(rw+".properties", p, nil, nil)
			}
		}
	}
}

// checkURIReference reports whether s is a valid URI reference (RFC 3986)
// as SARIF's "format": "uri-reference" requires: it parses, and holds no
// character that must be percent-encoded.
func checkURIReference(s string) error {
	if _, err := url.Parse(s); err != nil {
		return err
	}
	for _, c := range s {
		if c <= ' ' || c >= 0x7f || strings.ContainsRune(`"<>\^`+"`{|}", c) {
			return fmt.Errorf("%q: character %q must be percent-encoded", s, c)
		}
	}
	if i := strings.IndexByte(s, ':'); i >= 0 && !strings.Contains(s[:i], "/") {
		if u, _ := url.Parse(s); u.Scheme == "" {
			return fmt.Errorf("%q: a relative reference whose first segment holds ':' is read as a scheme", s)
		}
	}
	return nil
}

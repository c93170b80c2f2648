package capture

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"fp16audit/internal/batch"
	"fp16audit/internal/onnx"
)

// maxManifest bounds manifest.json: a manifest is a few kilobytes.
const maxManifest = 16 << 20

// Capture is an opened and checked capture folder.
type Capture struct {
	// Dir is the folder as the caller named it.
	Dir      string
	Manifest Manifest
	// Minor is the manifest's minor version.
	Minor int
	// Notes are facts about the folder a reader should know (files the
	// manifest does not list, which nothing reads).
	Notes []string

	// hashed delivers the outcome of the sha256 checks Start left running
	// (nil: none are); Verify reads it once into verified.
	hashed   chan []Problem
	verified *RefusedError
}

// Path returns the path of rel (a checked manifest path) inside the
// folder.
func (c *Capture) Path(rel string) string {
	return filepath.Join(c.Dir, filepath.FromSlash(rel))
}

// Problem is one reason a capture is refused: the file or field it is
// about, what is wrong, and what to do.
type Problem struct {
	Path string
	What string
	Do   string
}

// RefusedError is a capture folder Open does not trust or cannot read;
// it lists every problem found.
type RefusedError struct {
	Dir      string
	Problems []Problem
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "capture %s refused", e.Dir)
	if len(e.Problems) == 1 {
		p := e.Problems[0]
		fmt.Fprintf(&b, ": %s: %s", p.Path, p.What)
		if p.Do != "" {
			fmt.Fprintf(&b, "; %s", p.Do)
		}
		return b.String()
	}
	fmt.Fprintf(&b, " (%d problems):", len(e.Problems))
	for _, p := range e.Problems {
		fmt.Fprintf(&b, "\n  - %s: %s", p.Path, p.What)
		if p.Do != "" {
			fmt.Fprintf(&b, "; %s", p.Do)
		}
	}
	return b.String()
}

// Problem texts shared by several checks.
const (
	doRecapture = "capture the step again, or ask whoever shared the capture for the folder as the recorder wrote it"
	doPickle    = "a capture holds no code: tensors are .npz or safetensors and state is JSON; do not replay a folder someone made otherwise"
	doEscape    = "a capture's paths are relative, use /, stay inside the folder and pass through no symlink; this folder was not written by fp16audit's recorder"
)

// hashInline is the size up to which Start hashes a file before it
// returns; a larger one (the model's weights) is hashed by a goroutine
// while the caller goes on (Verify waits for it). A variable for the
// tests.
var hashInline int64 = 4 << 20

// Open reads and checks the capture folder dir. It returns a
// *RefusedError naming every problem when the folder is not a capture,
// comes from a newer format, names a path outside itself, holds a pickle,
// or has a file that is missing, truncated or changed.
func Open(dir string) (*Capture, error) {
	c, err := Start(dir)
	if err != nil {
		return nil, err
	}
	if err := c.Verify(); err != nil {
		return nil, err
	}
	return c, nil
}

// Start checks the capture folder dir as Open does, except that the
// sha256 of a file larger than a few megabytes (the model's weights) is
// computed by a goroutine, once, while the caller reads the folder:
// every path, size, header and array is checked before Start returns, so
// nothing the caller opens can be truncated, escape the folder or hold a
// pickle; a file changed after the capture was written is refused by
// Verify, which the caller must call before it trusts what it read.
func Start(dir string) (*Capture, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, refuse(dir, dir, "no such folder", "pass the capture folder the recorder wrote (captures/step-000412-scale-collapse)")
		}
		return nil, refuse(dir, dir, err.Error(), "")
	}
	if !fi.IsDir() {
		return nil, refuse(dir, dir, "is a file, not a capture folder", "pass the folder that holds manifest.json")
	}
	c := &Capture{Dir: dir}
	m, minor, err := readManifest(dir)
	if err != nil {
		return nil, err
	}
	c.Manifest, c.Minor = *m, minor
	var probs []Problem
	add := func(p Problem) { probs = append(probs, p) }
	checkFields(m, add)
	// Every path is checked before any file is opened.
	bad := map[string]bool{}
	for _, fp := range m.paths() {
		if what := checkRel(dir, fp[1]); what != "" {
			add(Problem{fp[0] + " " + quote(fp[1]), what, doEscape})
			bad[fp[1]] = true
			continue
		}
		if _, ok := m.Files[fp[1]]; !ok {
			add(Problem{fp[0] + " " + quote(fp[1]), "is not listed in the manifest's files, so its size and sha256 cannot be checked", doRecapture})
			bad[fp[1]] = true
		}
	}
	names := make([]string, 0, len(m.Files))
	for name := range m.Files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if bad[name] {
			continue
		}
		if what := checkRel(dir, name); what != "" {
			add(Problem{"files " + quote(name), what, doEscape})
			bad[name] = true
		}
	}
	c.Notes = append(c.Notes, walk(dir, m, add)...)
	// The files the replay reads: the model and its external data, which
	// may lie in the state's safetensors file (format 1.1 holds each
	// weight once).
	external := map[string]bool{}
	if m.Model.Path != "" && !bad[m.Model.Path] {
		external = checkModel(c, add)
	}
	// The files themselves: size, no pickle, and the sha256 of every file
	// the replay reads. The state (the tensors the model does not read,
	// the optimizer's and the RNG's JSON) only the Python continuations
	// read, which check their hashes themselves: here their sizes (and the
	// tensors' headers) are checked, not hashed (on a 100 M-parameter model
	// with Adam that is a gigabyte not read).
	var later []string
	for _, name := range names {
		if bad[name] {
			continue
		}
		want := m.Files[name]
		hash := !strings.HasPrefix(name, "state/") || external[name]
		if p, ok := checkFile(dir, name, want, hash && want.Bytes <= hashInline); !ok {
			add(p)
			bad[name] = true
		} else if hash && want.Bytes > hashInline {
			later = append(later, name)
		}
	}
	// What the replay reads: the arrays, the tensors' headers, the model.
	if !bad[m.Batches.Failing.Inputs] {
		checkArrays(c, m.Batches.Failing, "batches.failing", bad, add)
	}
	if p := m.Batches.Previous; p != nil && !bad[p.Inputs] {
		checkArrays(c, *p, "batches.previous", bad, add)
	}
	for _, name := range names {
		if strings.HasSuffix(name, ".safetensors") && !bad[name] {
			if what := checkSafetensors(c.Path(name)); what != "" {
				add(Problem{name, what, doRecapture})
			}
		}
	}
	for _, name := range []string{ptr(m.RNG), optState(m)} {
		if name != "" && !bad[name] {
			if what := checkJSON(c.Path(name)); what != "" {
				add(Problem{name, what, doRecapture})
			}
		}
	}
	if len(probs) > 0 {
		return nil, &RefusedError{Dir: dir, Problems: probs}
	}
	if len(later) > 0 {
		c.hashed = make(chan []Problem, 1)
		go func() {
			var ps []Problem
			for _, name := range later {
				if p, ok := checkHash(dir, name, m.Files[name]); !ok {
					ps = append(ps, p)
				}
			}
			c.hashed <- ps
		}()
	}
	return c, nil
}

// Verify waits for the sha256 checks Start left running and returns a
// *RefusedError naming each file whose content differs from the
// manifest's; nil when every file is as the recorder wrote it (at once
// after Open).
func (c *Capture) Verify() error {
	if c.hashed != nil {
		if ps := <-c.hashed; len(ps) > 0 {
			c.verified = &RefusedError{Dir: c.Dir, Problems: ps}
		}
		c.hashed = nil
	}
	if c.verified != nil {
		return c.verified
	}
	return nil
}

func refuse(dir, path, what, do string) error {
	return &RefusedError{Dir: dir, Problems: []Problem{{path, what, do}}}
}

func quote(s string) string { return fmt.Sprintf("%q", s) }

func ptr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func optState(m *Manifest) string {
	if m.Optimizer == nil {
		return ""
	}
	return m.Optimizer.State
}

// readManifest reads manifest.json: its format and major version first,
// so that a newer format is refused by name before its fields are read.
func readManifest(dir string) (*Manifest, int, error) {
	path := filepath.Join(dir, ManifestFile)
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, 0, refuse(dir, ManifestFile, "missing: this is not a capture folder, or a capture interrupted before it was complete (the recorder writes manifest.json last)",
			"pass a folder step-<step>-<trigger> that the recorder wrote; a folder named .step-….tmp-<pid> is an unfinished one and can be deleted")
	case err != nil:
		return nil, 0, refuse(dir, ManifestFile, err.Error(), "")
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, 0, refuse(dir, ManifestFile, "is a symlink", doEscape)
	case !fi.Mode().IsRegular():
		return nil, 0, refuse(dir, ManifestFile, "is not a regular file", doEscape)
	case fi.Size() > maxManifest:
		return nil, 0, refuse(dir, ManifestFile, fmt.Sprintf("%d bytes, more than a manifest holds (%d at most)", fi.Size(), maxManifest), doRecapture)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, refuse(dir, ManifestFile, err.Error(), "")
	}
	var head struct {
		Format  any `json:"format"`
		Version any `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, 0, refuse(dir, ManifestFile, "is not a JSON object: "+err.Error(), doRecapture)
	}
	if head.Format != Format {
		return nil, 0, refuse(dir, ManifestFile, fmt.Sprintf("format %v: want %q; this folder is not an fp16audit capture", jsonText(head.Format), Format), "pass the folder the recorder wrote")
	}
	v, ok := head.Version.(string)
	if !ok {
		return nil, 0, refuse(dir, ManifestFile, fmt.Sprintf("version %v: want a string such as \"1.0\"", jsonText(head.Version)), doRecapture)
	}
	major, minor, err := version(v)
	if err != nil {
		return nil, 0, refuse(dir, ManifestFile, err.Error(), doRecapture)
	}
	if major > Major {
		return nil, 0, refuse(dir, ManifestFile, fmt.Sprintf("capture format %s is newer than this fp16audit reads (%d.x)", v, Major),
			"upgrade fp16audit (pip install -U fp16audit) to replay it")
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, 0, refuse(dir, ManifestFile, "a field does not have the type format 1 gives it: "+err.Error(), doRecapture)
	}
	return &m, minor, nil
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// checkFields checks the entries the replay cannot do without.
func checkFields(m *Manifest, add func(Problem)) {
	need := func(field, v string) {
		if v == "" {
			add(Problem{ManifestFile, field + " is missing", doRecapture})
		}
	}
	need("model.path", m.Model.Path)
	need("batches.failing.inputs", m.Batches.Failing.Inputs)
	need("precision.policy", m.Precision.Policy)
	need("trigger.kind", m.Trigger.Kind)
	if len(m.Files) == 0 {
		add(Problem{ManifestFile, "files is missing or empty: no file's size and sha256 can be checked", doRecapture})
	}
	if len(m.Model.Inputs) == 0 {
		add(Problem{ManifestFile, "model.inputs is missing: the batch's arrays cannot be bound to the model's inputs", doRecapture})
	}
}

// checkRel says what is wrong with rel as a path inside dir ("" when
// nothing): it must be relative, written with /, without . or ..
// segments, and reach a regular file through folders that are not
// symlinks. Only Lstat is called: nothing is opened.
func checkRel(dir, rel string) string {
	switch {
	case rel == "":
		return "is empty"
	case strings.ContainsRune(rel, 0):
		return "holds a NUL byte"
	case strings.HasPrefix(rel, "/") || filepath.IsAbs(rel) || (len(rel) > 1 && rel[1] == ':'):
		return "is absolute"
	case strings.Contains(rel, `\`):
		return "holds a backslash; a capture's paths use /"
	}
	segs := strings.Split(rel, "/")
	if slices.Contains(segs, "..") {
		return "escapes the folder (a .. segment)"
	}
	if slices.Contains(segs, "") || slices.Contains(segs, ".") {
		return "has an empty or . segment"
	}
	at := dir
	for i, s := range segs {
		at = filepath.Join(at, s)
		fi, err := os.Lstat(at)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "is missing"
			}
			return err.Error()
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Sprintf("passes through the symlink %q", strings.Join(segs[:i+1], "/"))
		}
		if i < len(segs)-1 && !fi.IsDir() {
			return fmt.Sprintf("%q is not a folder", strings.Join(segs[:i+1], "/"))
		}
		if i == len(segs)-1 && !fi.Mode().IsRegular() {
			return "is not a regular file"
		}
	}
	return ""
}

// picklish are the names of files that hold pickles: Python's own, and
// what torch.save and joblib write.
var picklish = []string{".pkl", ".pickle", ".pt", ".pth", ".ckpt", ".joblib"}

// walk looks at every entry of the folder without following symlinks: a
// symlink or a pickle anywhere is a problem; a file the manifest does not
// list is a note (nothing reads it).
func walk(dir string, m *Manifest, add func(Problem)) []string {
	var extra []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			add(Problem{path, err.Error(), ""})
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			add(Problem{rel, "is a symlink; a capture holds only plain files and folders", doEscape})
			return nil
		}
		if d.IsDir() || rel == ManifestFile {
			return nil
		}
		lower := strings.ToLower(rel)
		for _, ext := range picklish {
			if strings.HasSuffix(lower, ext) {
				add(Problem{rel, "is named as a pickle (" + ext + "): pickles run code when they are loaded", doPickle})
				return nil
			}
		}
		if _, listed := m.Files[rel]; listed {
			return nil
		}
		if d.Type().IsRegular() {
			if what := sniffPickle(path); what != "" {
				add(Problem{rel, what, doPickle})
				return nil
			}
		}
		extra = append(extra, rel)
		return nil
	})
	if len(extra) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("the folder holds %d file(s) its manifest does not list (%s); nothing reads them", len(extra), strings.Join(limit(extra, 4), ", "))}
}

func limit(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}

// sniffPickle says whether the file at path holds a pickle: pickle's
// protocol 2–5 opcode first, or a zip archive with a .pkl member (what
// torch.save writes). "" when not.
func sniffPickle(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var head [4]byte
	n, _ := io.ReadFull(f, head[:])
	if n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5 {
		return fmt.Sprintf("holds a pickle (protocol %d): pickles run code when they are loaded", head[1])
	}
	if n == 4 && string(head[:]) == "PK\x03\x04" {
		fi, err := f.Stat()
		if err != nil {
			return ""
		}
		zr, err := zip.NewReader(f, fi.Size())
		if err != nil {
			return ""
		}
		for _, zf := range zr.File {
			if strings.HasSuffix(strings.ToLower(zf.Name), ".pkl") {
				return fmt.Sprintf("is a zip archive holding the pickle %q (torch.save's format): pickles run code when they are loaded", zf.Name)
			}
		}
	}
	return ""
}

// checkHash checks one listed file's sha256, reading it front to back.
func checkHash(dir, name string, want File) (Problem, bool) {
	f, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
	if err != nil {
		return Problem{name, err.Error(), doRecapture}, false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return Problem{name, err.Error(), doRecapture}, false
	}
	return sumProblem(name, hex.EncodeToString(h.Sum(nil)), want)
}

func sumProblem(name, got string, want File) (Problem, bool) {
	if !strings.EqualFold(got, want.SHA256) {
		return Problem{name, fmt.Sprintf("sha256 %s differs from the manifest's %s: the file changed after the capture was written", short(got), short(want.SHA256)), doRecapture}, false
	}
	return Problem{}, true
}

// checkFile checks one listed file's size and, with hash, its sha256, and
// that it is no pickle.
func checkFile(dir, name string, want File, hash bool) (Problem, bool) {
	path := filepath.Join(dir, filepath.FromSlash(name))
	if what := sniffPickle(path); what != "" {
		return Problem{name, what, doPickle}, false
	}
	f, err := os.Open(path)
	if err != nil {
		return Problem{name, err.Error(), doRecapture}, false
	}
	defer f.Close()
	h := sha256.New()
	var n int64
	if hash {
		n, err = io.Copy(h, f)
	} else {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil {
			n = fi.Size()
		}
	}
	if err != nil {
		return Problem{name, err.Error(), doRecapture}, false
	}
	if n != want.Bytes {
		what := fmt.Sprintf("%d bytes, the manifest says %d", n, want.Bytes)
		if n < want.Bytes {
			what += ": truncated (a copy cut short, or a disk that filled up)"
		}
		return Problem{name, what, doRecapture}, false
	}
	if hash {
		return sumProblem(name, hex.EncodeToString(h.Sum(nil)), want)
	}
	return Problem{}, true
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12] + "…"
	}
	return h
}

// checkArrays reads a batch's arrays: no member needs pickle, every model
// input has its member, and the target is an array.
func checkArrays(c *Capture, b Batch, field string, bad map[string]bool, add func(Problem)) {
	ts, err := batch.ReadNPZ(c.Path(b.Inputs))
	if err != nil {
		add(Problem{b.Inputs, strings.TrimPrefix(err.Error(), c.Path(b.Inputs)+": "), doPickleOr(err)})
	} else {
		have := map[string]bool{}
		for _, t := range ts {
			have[t.Name] = true
		}
		for _, in := range c.Manifest.Model.Inputs {
			if !have[in] {
				add(Problem{b.Inputs, fmt.Sprintf("has no array for the model input %q (%s)", in, field), doRecapture})
			}
		}
	}
	if b.Target != nil && !bad[*b.Target] {
		if _, err := batch.ReadNPY(c.Path(*b.Target)); err != nil {
			add(Problem{*b.Target, strings.TrimPrefix(err.Error(), c.Path(*b.Target)+": "), doPickleOr(err)})
		}
	}
}

func doPickleOr(err error) string {
	if strings.Contains(err.Error(), "pickle") {
		return doPickle
	}
	return doRecapture
}

// safetensors element sizes by dtype.
var stSizes = map[string]int64{"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
	"U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}

// checkSafetensors checks a safetensors file's header against its size:
// every tensor's bytes lie inside the data and match its dtype and shape.
func checkSafetensors(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return "shorter than safetensors' 8-byte header length: truncated"
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > 100<<20 || int64(n) > fi.Size()-8 {
		return fmt.Sprintf("its header claims %d bytes, the file holds %d after the length: truncated, or not safetensors", n, fi.Size()-8)
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(f, hb); err != nil {
		return "the header is cut short: truncated"
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(bytes.TrimRight(hb, " "), &header); err != nil {
		return "the header is not a JSON object: " + err.Error()
	}
	data := fi.Size() - 8 - int64(n)
	keys := make([]string, 0, len(header))
	for k := range header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "__metadata__" {
			continue
		}
		var e struct {
			DType   string  `json:"dtype"`
			Shape   []int64 `json:"shape"`
			Offsets []int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(header[k], &e); err != nil || len(e.Offsets) != 2 {
			return fmt.Sprintf("tensor %q: want dtype, shape and two data_offsets", k)
		}
		size, ok := stSizes[e.DType]
		if !ok {
			return fmt.Sprintf("tensor %q: unknown dtype %q", k, e.DType)
		}
		count := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && count > (1<<62)/d) {
				return fmt.Sprintf("tensor %q: shape %v is not a shape", k, e.Shape)
			}
			count *= d
		}
		b, end := e.Offsets[0], e.Offsets[1]
		if b < 0 || end < b || end-b != count*size {
			return fmt.Sprintf("tensor %q: offsets [%d, %d) do not hold %d %s elements of shape %v", k, b, end, count, e.DType, e.Shape)
		}
		if end > data {
			return fmt.Sprintf("tensor %q: truncated: its data ends at byte %d, the file holds %d bytes of data", k, end, data)
		}
	}
	return ""
}

// checkJSON says whether path holds one JSON value.
func checkJSON(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if !json.Valid(data) {
		return "is not JSON"
	}
	return ""
}

// checkModel decodes the ONNX model and checks every external data
// location it names as a manifest path before anything opens the data;
// it returns those paths.
func checkModel(c *Capture, add func(Problem)) map[string]bool {
	m := c.Manifest
	used := map[string]bool{}
	data, err := os.ReadFile(c.Path(m.Model.Path))
	if err != nil {
		add(Problem{m.Model.Path, err.Error(), doRecapture})
		return used
	}
	var mp onnx.ModelProto
	if err := proto.Unmarshal(data, &mp); err != nil || mp.GetGraph() == nil {
		what := "does not decode as an ONNX model"
		if err != nil {
			what += ": " + err.Error()
		}
		add(Problem{m.Model.Path, what, "the export at capture time failed or the file was damaged: " + doRecapture})
		return used
	}
	seen := map[string]bool{}
	_ = onnx.WalkTensors(&mp, func(where string, t *onnx.TensorProto) error {
		if t.GetDataLocation() != onnx.TensorProto_EXTERNAL {
			return nil
		}
		loc := ""
		for _, kv := range t.GetExternalData() {
			if kv.GetKey() == "location" {
				loc = kv.GetValue()
			}
		}
		if seen[loc] {
			return nil
		}
		seen[loc] = true
		// External data is resolved beside the model.
		rel := loc
		if d := filepath.ToSlash(filepath.Dir(filepath.FromSlash(m.Model.Path))); d != "." {
			rel = d + "/" + loc
		}
		field := fmt.Sprintf("%s: external data of %s", m.Model.Path, where+t.GetName())
		if what := checkRel(c.Dir, rel); what != "" {
			add(Problem{field + " " + quote(loc), what, doEscape})
			return nil
		}
		if _, ok := m.Files[rel]; !ok {
			add(Problem{field + " " + quote(loc), "is not listed in the manifest's files, so its size and sha256 cannot be checked", doRecapture})
			return nil
		}
		used[rel] = true
		return nil
	})
	return used
}

// StateShapes returns the tensors of the model's state (its parameters
// and buffers, named as model.state_dict() names them) with their
// shapes, read from the safetensors header; nil without a state file.
func (c *Capture) StateShapes() (map[string][]int64, error) {
	if c.Manifest.Model.State == "" {
		return nil, nil
	}
	f, err := os.Open(c.Path(c.Manifest.Model.State))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var lenBuf [8]byte
	if _, err := io.ReadFull(f, lenBuf[:]); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Manifest.Model.State, err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > 100<<20 {
		return nil, fmt.Errorf("%s: header of %d bytes", c.Manifest.Model.State, n)
	}
	hb := make([]byte, n)
	if _, err := io.ReadFull(f, hb); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Manifest.Model.State, err)
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(bytes.TrimRight(hb, " "), &header); err != nil {
		return nil, fmt.Errorf("%s: %w", c.Manifest.Model.State, err)
	}
	shapes := make(map[string][]int64, len(header))
	for k, raw := range header {
		if k == "__metadata__" {
			continue
		}
		var e struct {
			Shape []int64 `json:"shape"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, fmt.Errorf("%s: tensor %q: %w", c.Manifest.Model.State, k, err)
		}
		shapes[k] = e.Shape
	}
	return shapes, nil
}

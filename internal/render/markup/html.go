package markup

import (
	"html/template"
	"strconv"
	"strings"
)

// Page parses an HTML page of the renderers: the opening every page shares
// (doctype, the head with the title template title and the style sheet
// .CSS, <body>), the page's own header and main, then the shared closing
// (the page's data as JSON in .Data, which its inline script .Script
// reads). The view it executes with has fields CSS, Data and Script.
func Page(name string, funcs template.FuncMap, title, header, main string) *template.Template {
	return template.Must(template.New(name).Funcs(funcs).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>` + title + `</title>
<style>{{.CSS}}</style>
</head>
<body>
` + header + `
<main>
` + main + `</main>
<script type="application/json" id="fp16audit-data">{{.Data}}</script>
<script>{{.Script}}</script>
</body>
</html>
`))
}

// PageCSS is the style sheet both HTML pages (the audit's and the scales
// diagnosis's) start from.
const PageCSS = `
:root{--ink:#1d2330;--mute:#5c6370;--line:#dde1e7;--bad:#c92a2a;--badbg:#fff0f0;--ok:#2b8a3e;--okbg:#ebfbee;--warn:#b35c00}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--ink);background:#f4f5f7}
header{padding:14px 28px 6px}
h1{font-size:20px;margin:0}
h2{font-size:17px;margin:0 0 10px}
h3{font-size:15px;margin:14px 0 6px}
.sub,.small{color:var(--mute);margin:2px 0}
.small{font-size:13px}
main{padding:0 28px 28px}
.card{background:#fff;border:1px solid var(--line);border-radius:8px;padding:16px 20px;margin:12px 0}
.card.fail{border-left:8px solid var(--bad);background:linear-gradient(90deg,var(--badbg),#fff 40%)}
.card.ok{border-left:8px solid var(--ok);background:linear-gradient(90deg,var(--okbg),#fff 40%)}
#verdict h2{font-size:24px}
.fail .badge,.fail #verdict-id{color:var(--bad)}
.ok .badge,.ok #verdict-id{color:var(--ok)}
.card.caution{border-left:8px solid var(--warn);background:linear-gradient(90deg,#fff4e6,#fff 40%)}
.caution .badge,.caution #verdict-id{color:var(--warn)}
.vtext{font-size:16px;margin:0 0 6px}
code,pre{font:12.5px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid var(--line);border-radius:4px;padding:6px 8px;margin:4px 0;white-space:pre-wrap}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:3px 14px;margin:4px 0}
dl.kv dt{color:var(--mute)}
dl.kv dd{margin:0}
.origin-box{border-top:1px solid var(--line);margin-top:8px}
ul.fixes{list-style:none;padding:0;margin:0}
ul.fixes li{padding:6px 0;border-top:1px solid var(--line)}
.fk{font-weight:600}
.works .fk{color:var(--ok)}
.fails .fk{color:var(--bad)}
.ba{color:var(--mute);margin-left:8px}
.snip{margin:4px 0 0 18px}
.warn{color:var(--warn)}
#chartbox{position:relative}
#chart{width:100%;height:auto;display:block;user-select:none}
#chart text{font-size:12px;fill:var(--ink)}
#chart .lg{font-size:13px}
#chart .note{fill:var(--mute)}
#chart .yl{text-anchor:end;fill:var(--mute)}
#chart .yl.bad,#chart .rl.bad,#chart .rl.max{fill:var(--bad);font-weight:600}
#chart .rl.uf{fill:#1971c2}
#chart .rl.sub{fill:var(--mute);font-size:11px}
#chart .xl{text-anchor:middle;fill:var(--mute)}
#chart .grid line{stroke:#eceef1}
#chart line.max{stroke:var(--bad);stroke-width:1.5;stroke-dasharray:7 4}
#chart line.bad{stroke:#ffa8a8;stroke-width:1}
#chart line.uf{stroke:#1971c2;stroke-width:1;stroke-dasharray:3 3}
#chart .badband{fill:#fff5f5}
#plot .series{fill:none;stroke-linejoin:round;vector-effect:non-scaling-stroke}
#plot .flagged{fill:#fa5252}
#plot .dots{stroke:#e03131;stroke-width:9;stroke-linecap:round;fill:none;vector-effect:non-scaling-stroke}
#chart .origin line{stroke:var(--bad);stroke-width:1.5}
#chart .origin text{fill:var(--bad);font-weight:700;font-size:13px}
#chart #xaxis text{text-anchor:middle;fill:var(--mute)}
#chart #xaxis line{stroke:#9aa0a6}
#cursor{stroke:#495057;stroke-width:1}
#brush{fill:#4dabf7;opacity:.2}
#hit{fill:transparent;cursor:crosshair}
#tip{position:absolute;top:0;left:0;background:#fff;border:1px solid #adb5bd;border-radius:6px;box-shadow:0 2px 10px rgba(0,0,0,.15);padding:8px 10px;font-size:12.5px;pointer-events:none;max-width:520px}
#tip b{word-break:break-all}
#tip table{border-collapse:collapse;margin-top:4px}
#tip td,#tip th{padding:1px 6px;text-align:right}
#tip td:first-child,#tip th:first-child{text-align:left}
.controls{display:flex;gap:18px;flex-wrap:wrap;align-items:center;margin-bottom:8px}
#count{color:var(--mute)}
.tablebox{max-height:75vh;overflow:auto;border:1px solid var(--line)}
table{border-collapse:collapse;width:100%}
th,td{padding:3px 8px;border-bottom:1px solid #eef0f3;text-align:left;white-space:nowrap}
th{background:#f8f9fa;position:sticky;top:0;cursor:pointer;font-weight:600}
th.asc::after{content:" ▲"}
th.desc::after{content:" ▼"}
.num{text-align:right;font-variant-numeric:tabular-nums}
#nodes th{white-space:normal;vertical-align:bottom}
#nodes div.nm{max-width:340px;overflow:hidden;text-overflow:ellipsis}
#nodes div.aux{max-width:260px;overflow:hidden;text-overflow:ellipsis;color:var(--mute)}
#nodes tr.fl td{background:#fff0f0}
#nodes tr.orig td{background:#ffc9c9;font-weight:600}
#nodes tr.hl td{outline:2px solid #1971c2}
#nodes td.nf{color:var(--bad);font-weight:700}
#nodes td.neg{color:var(--bad)}
table.plain th{cursor:default;position:static}
tr.sev-error td:first-child{color:var(--bad);font-weight:700}
tr.sev-warning td:first-child{color:var(--warn);font-weight:600}
table.plain td:last-child{white-space:normal}
ul.batches,ul.notes{margin:2px 0;padding-left:18px}
button{font:inherit;padding:3px 10px}
#plot .held{stroke:#868e96;stroke-width:6;stroke-linecap:round;fill:none;vector-effect:non-scaling-stroke}
#plot .offscale{stroke:#ced4da;stroke-width:6;stroke-linecap:round;fill:none;vector-effect:non-scaling-stroke}
#growth{width:100%;height:auto;display:block}
#growth text{font-size:12px;fill:var(--ink)}
#growth .lg{font-size:13px}
#growth .note,#growth .xl{fill:var(--mute)}
#growth .yl{text-anchor:end;fill:var(--mute)}
#growth .yl.bad,#growth .rl.max{fill:var(--bad);font-weight:600}
#growth .grid line{stroke:#eceef1}
#growth line.max{stroke:var(--bad);stroke-width:1.5;stroke-dasharray:7 4}
#growth .badband{fill:#fff5f5}
#growth .series{fill:none;stroke-linejoin:round}
#nodes tr.blk td{background:#f1f3f5;font-weight:600;cursor:pointer}
#nodes tr.blk.fl td{background:#ffe3e3}
`

// Coord formats a chart coordinate with at most two decimals.
func Coord(x float64) string {
	s := strconv.FormatFloat(x, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "-0" {
		return "0"
	}
	return s
}

// Pow2 writes 2 to the power e with superscript digits.
func Pow2(e int) string {
	sup := strings.NewReplacer("-", "⁻", "0", "⁰", "1", "¹", "2", "²", "3", "³", "4", "⁴", "5", "⁵", "6", "⁶", "7", "⁷", "8", "⁸", "9", "⁹")
	return "2" + sup.Replace(strconv.Itoa(e))
}

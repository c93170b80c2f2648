package diagnose

import (
	"fp16audit/internal/observe"
	"fp16audit/report"
)

// StatsReport is the report's form of the statistics of one value in one
// pass and, for an emulated pass, of its comparison with fp32 (d may be
// nil). Magnitudes that would be infinite are left out.
func StatsReport(s observe.Stats, d *observe.Diff) report.StatsReport {
	r := report.StatsReport{
		Count: s.Count, MaxAbs: float64(s.MaxAbs), ArgMaxBatch: s.ArgMaxBatch, ArgMax: s.ArgMax,
		MinNonzero: float64(s.MinNonzero), Mean: s.Mean(), RMS: s.RMS(),
		NaN: s.NaN, PosInf: s.PosInf, NegInf: s.NegInf, Zeros: s.Zeros,
		AboveFP16Max: s.AboveFP16Max, FP16Subnormal: s.FP16Subnormal, FP16Flush: s.FP16Flush,
	}
	if h := s.HeadroomBits(); !isInfOrNaN(h) {
		r.HeadroomBits = &h
	}
	if d != nil {
		if re := d.RelErr(); !isInfOrNaN(re) {
			r.RelErr = &re
		}
		r.NewNonFinite = d.NewNonFinite
		r.FlushedFraction = d.FlushedFraction()
	}
	return r
}

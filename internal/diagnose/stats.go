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
		Count: s.Count, Finite: s.Finite, ArgMaxBatch: s.ArgMaxBatch, ArgMax: s.ArgMax,
		NaN: s.NaN, PosInf: s.PosInf, NegInf: s.NegInf, Zeros: s.Zeros,
		AboveFP16Max: s.AboveFP16Max, FP16Subnormal: s.FP16Subnormal, FP16Flush: s.FP16Flush,
	}
	if s.Finite > 0 {
		r.MaxAbs, r.Mean, r.RMS = ptr(float64(s.MaxAbs)), ptr(s.Mean()), ptr(s.RMS())
	}
	if s.MinNonzero != 0 {
		r.MinNonzero = ptr(float64(s.MinNonzero))
	}
	if h := s.HeadroomBits(); s.Finite > 0 && !isInfOrNaN(h) {
		r.HeadroomBits = &h
	}
	if d != nil {
		r.Compared = d.BothFinite
		if re := d.RelErr(); !isInfOrNaN(re) {
			r.RelErr = &re
		}
		r.NewNonFinite = d.NewNonFinite
		r.FlushedFraction = d.FlushedFraction()
	}
	return r
}

func ptr(x float64) *float64 { return &x }

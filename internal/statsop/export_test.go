package statsop

// SetSIMD exposes setSIMD to the external tests.
var SetSIMD = setSIMD

// The record slots the tests fill by hand.
const (
	SlotRank = slotRank
	SlotDims = slotDims
)

// ObserveRecord is the record Observe makes of x.
func ObserveRecord(x []float32) Record { return observeRecords(0, x)[0] }

// SetRoundSIMD exposes setRoundSIMD to the external tests.
var SetRoundSIMD = setRoundSIMD

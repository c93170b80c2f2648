package tfevents

import (
	"math"
	"strings"
	"testing"
)

// crc32cBitwise is CRC-32C computed bit by bit from its definition
// (reflected polynomial 0x82F63B78, initial value and final xor all ones),
// independent of hash/crc32's tables.
func crc32cBitwise(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc ^= uint32(c)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0x82F63B78
			} else {
				crc >>= 1
			}
		}
	}
	return ^crc
}

// docMask is the masking rule as the TFRecord documentation writes it.
func docMask(crc uint32) uint32 { return ((crc >> 15) | (crc << 17)) + 0xa282ead8 }

func TestCRC32CCheckValue(t *testing.T) {
	// The catalogued check value of CRC-32C for "123456789".
	if got := crc32cBitwise([]byte("123456789")); got != 0xE3069283 {
		t.Fatalf("bitwise crc32c = %#x, want 0xe3069283", got)
	}
	for _, s := range []string{"", "123456789", "brain.Event:2", strings.Repeat("x", 1000)} {
		if got, want := maskedCRC([]byte(s)), docMask(crc32cBitwise([]byte(s))); got != want {
			t.Errorf("maskedCRC(%q) = %#x, want %#x", s, got, want)
		}
	}
}

func TestHalfToFloat64(t *testing.T) {
	for _, tc := range []struct {
		bits uint16
		want float64
	}{
		{0x0000, 0}, {0x0001, math.Ldexp(1, -24)}, {0x0400, math.Ldexp(1, -14)},
		{0x3C00, 1}, {0x7BFF, 65504}, {0xFC00, math.Inf(-1)}, {0xC000, -2},
	} {
		if got := halfToFloat64(tc.bits); got != tc.want {
			t.Errorf("halfToFloat64(%#04x) = %v, want %v", tc.bits, got, tc.want)
		}
	}
	if !math.IsNaN(halfToFloat64(0x7E00)) {
		t.Error("0x7e00 is NaN")
	}
}

package execute

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ParseSize parses a byte size as --max-memory takes it: a number with an
// optional binary unit K, M, G or T (an optional trailing "B" or "iB" is
// accepted), e.g. 512M, 4G, 1.5G, 1073741824.
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("size %q: want a positive number of bytes with an optional unit K, M, G or T, e.g. 512M or 4G", s)
	}
	return int64(v * float64(mult)), nil
}

// FormatSize formats a byte count with a binary unit: 1.5 GiB, 320 MiB.
func FormatSize(n int64) string {
	const units = "KMGT"
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	u := -1
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f %ciB", v, units[u])
	}
	return fmt.Sprintf("%.3g %ciB", v, units[u])
}

// memAvailable is availableMemory; tests replace it.
var memAvailable = availableMemory

// memResident is residentMemory; tests replace it.
var memResident = residentMemory

// residentMemory returns the process's resident memory now (the loaded
// libraries, the model, the batches), from /proc/self/statm; ok is false
// where it cannot be read.
func residentMemory() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize()), err == nil
}

// availableMemory returns the memory this process can still take without
// swapping or being killed: /proc/meminfo's MemAvailable, lowered to the
// room left under a cgroup (v2 or v1) memory limit when one is set. The
// string names the source; ok is false where neither can be read.
func availableMemory() (int64, string, bool) {
	avail, ok := memInfoAvailable()
	src := "MemAvailable in /proc/meminfo"
	if room, ok2 := cgroupRoom(); ok2 && (!ok || room < avail) {
		avail, src, ok = room, "the cgroup memory limit", true
	}
	return avail, src, ok
}

func memInfoAvailable() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// cgroupRoom returns limit − usage of the process's memory cgroup, with
// reclaimable page cache not counted as usage.
func cgroupRoom() (int64, bool) {
	readInt := func(path string) (int64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	statValue := func(path, key string) int64 {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == key {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				return v
			}
		}
		return 0
	}
	// cgroup v2 ("max" does not parse: no limit).
	if limit, ok := readInt("/sys/fs/cgroup/memory.max"); ok {
		if used, ok := readInt("/sys/fs/cgroup/memory.current"); ok {
			used -= statValue("/sys/fs/cgroup/memory.stat", "inactive_file")
			return max(limit-used, 0), true
		}
	}
	// cgroup v1: an unlimited group reports a huge limit.
	if limit, ok := readInt("/sys/fs/cgroup/memory/memory.limit_in_bytes"); ok && limit < 1<<60 {
		if used, ok := readInt("/sys/fs/cgroup/memory/memory.usage_in_bytes"); ok {
			used -= statValue("/sys/fs/cgroup/memory/memory.stat", "total_inactive_file")
			return max(limit-used, 0), true
		}
	}
	return 0, false
}

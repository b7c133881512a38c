package dbx

import (
	"math"
	"time"
)

// Seconds converts a server-side count of seconds, saturating at the
// Duration range: counts measured to timestamps other clients wrote far
// off, or infinite, exceed it. NaN is 0.
func Seconds(s float64) time.Duration {
	ns := s * float64(time.Second)
	switch {
	case math.IsNaN(ns):
		return 0
	case ns >= math.MaxInt64:
		return math.MaxInt64
	case ns <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(ns)
}

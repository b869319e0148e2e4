package interop

import (
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"
)

// metricSample is one line of Prometheus text exposition.
type metricSample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrapeMetrics fetches and parses GET /debug/varz.
func (s *server) scrapeMetrics() ([]metricSample, error) {
	resp, err := s.httpc.Get(s.baseURL() + "/debug/varz")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /debug/varz: %s: %.200s", resp.Status, body)
	}
	return parseMetrics(string(body))
}

// parseMetrics parses the Prometheus text format (the subset servers emit:
// name, optional {labels}, value, optional timestamp).
func parseMetrics(text string) ([]metricSample, error) {
	var out []metricSample
	for lineNo, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var m metricSample
		rest := line
		i := strings.IndexAny(rest, "{ \t")
		if i < 0 {
			return nil, fmt.Errorf("line %d: no value: %q", lineNo+1, line)
		}
		m.name = rest[:i]
		rest = rest[i:]
		m.labels = map[string]string{}
		if strings.HasPrefix(rest, "{") {
			var err error
			rest, err = parseLabels(rest[1:], m.labels)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v: %q", lineNo+1, err, line)
			}
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 {
			return nil, fmt.Errorf("line %d: no value: %q", lineNo+1, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("line %d: bad value: %q", lineNo+1, line)
		}
		m.value = v
		out = append(out, m)
	}
	return out, nil
}

// parseLabels parses `k="v",k2="v2"}` (after the opening brace) into dst and
// returns the text after the closing brace.
func parseLabels(s string, dst map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " ,")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 || len(s) < eq+2 || s[eq+1] != '"' {
			return "", fmt.Errorf("bad label syntax")
		}
		name := strings.TrimSpace(s[:eq])
		s = s[eq+2:]
		var val strings.Builder
		closed := false
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			if c == '"' {
				s = s[i+1:]
				closed = true
				break
			}
			val.WriteByte(c)
		}
		if !closed {
			return "", fmt.Errorf("unterminated label value")
		}
		dst[name] = val.String()
	}
}

// labelSet turns "k=v" pairs into a map.
func labelSet(kv []string) map[string]string {
	m := map[string]string{}
	for _, p := range kv {
		k, v, _ := strings.Cut(p, "=")
		m[k] = v
	}
	return m
}

// metric returns the value of the sample with exactly this name and label
// set ("k=v" strings), and whether it exists.
func (s *server) metric(t testing.TB, name string, labels ...string) (float64, bool) {
	t.Helper()
	samples, err := s.scrapeMetrics()
	if err != nil {
		t.Fatalf("scraping metrics: %v", err)
	}
	return findMetric(samples, name, labelSet(labels))
}

func findMetric(samples []metricSample, name string, want map[string]string) (float64, bool) {
	for _, m := range samples {
		if m.name == name && maps.Equal(m.labels, want) {
			return m.value, true
		}
	}
	return 0, false
}

// mustMetric is metric, failing the test if the sample is absent.
func (s *server) mustMetric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.metric(t, name, labels...)
	if !ok {
		t.Fatalf("%s: metric %s%v not exported", s.kind, name, labels)
	}
	return v
}

// waitMetric polls until the metric satisfies cond or the timeout passes.
func (s *server) waitMetric(t testing.TB, timeout time.Duration, desc string, cond func(float64) bool, name string, labels ...string) float64 {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last float64
	var present bool
	for {
		last, present = s.metric(t, name, labels...)
		if present && cond(last) {
			return last
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if !present {
		t.Fatalf("%s: metric %s%v not exported", s.kind, name, labels)
	}
	t.Fatalf("%s: metric %s%v = %v after %v; want %s", s.kind, name, labels, last, timeout, desc)
	return last
}

// waitMetricEq polls until the metric equals want.
func (s *server) waitMetricEq(t testing.TB, want float64, name string, labels ...string) {
	t.Helper()
	s.waitMetric(t, 5*time.Second, fmt.Sprintf("== %v", want), func(v float64) bool { return v == want }, name, labels...)
}

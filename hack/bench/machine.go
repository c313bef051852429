package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// machineInfo is the machine the figures were measured on, as the document states it.
type machineInfo struct {
	CPUs      int       `json:"cpus"`
	MemGiB    float64   `json:"memGiB"`
	CPUModel  string    `json:"cpuModel"`
	GoVersion string    `json:"goVersion"`
	Kernel    string    `json:"kernel"`
	Date      time.Time `json:"date"`
}

func describeMachine(ctx context.Context) (machineInfo, error) {
	m := machineInfo{Date: time.Now().UTC()}
	out, err := exec.CommandContext(ctx, "nproc").Output()
	if err != nil {
		return m, fmt.Errorf("nproc: %w", err)
	}
	if m.CPUs, err = strconv.Atoi(strings.TrimSpace(string(out))); err != nil {
		return m, fmt.Errorf("nproc: %w", err)
	}
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return m, err
	}
	if kib, ok := procField(string(meminfo), "MemTotal:"); ok {
		m.MemGiB = float64(kib) / (1 << 20)
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return m, err
	}
	for line := range strings.Lines(string(cpuinfo)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			m.CPUModel = strings.TrimSpace(v)
			break
		}
	}
	out, err = exec.CommandContext(ctx, "go", "version").Output()
	if err != nil {
		return m, fmt.Errorf("go version: %w", err)
	}
	m.GoVersion = strings.TrimPrefix(strings.TrimSpace(string(out)), "go version ")
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m, nil
}

// procField returns the first number after key in a /proc file of "key: value unit" lines.
func procField(text, key string) (int64, bool) {
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

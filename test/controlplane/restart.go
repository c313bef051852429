package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// StopAPIServer stops kube-apiserver, leaving etcd and its data, and every other component,
// running: clients see the outage a real control-plane restart causes. StartAPIServer brings it
// back on the same address.
func (c *Cluster) StopAPIServer() error {
	c.mu.Lock()
	i := slices.IndexFunc(c.procs, func(p *process) bool { return p.name == compAPIServer })
	if i < 0 {
		c.mu.Unlock()
		return errors.New("kube-apiserver is not running")
	}
	p := c.procs[i]
	c.mu.Unlock()
	c.apiServerArgs = p.cmd.Args[1:]
	c.apiServerPorts = p.ports
	err := p.stop(10 * time.Second)
	c.forget(p)
	return err
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the same flags and port,
// and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if c.apiServerArgs == nil {
		return errors.New("StartAPIServer without StopAPIServer")
	}
	c.mu.Lock()
	running := slices.ContainsFunc(c.procs, func(p *process) bool { return p.name == compAPIServer })
	c.mu.Unlock()
	if running {
		return errors.New("kube-apiserver is already running")
	}
	p, err := c.runOnPorts(compAPIServer, c.apiServerPorts, c.apiServerArgs)
	if err != nil {
		return err
	}
	ready := func(ctx context.Context) error {
		_, err := c.adminClient.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := waitReady(ctx, p, ready); err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	return nil
}

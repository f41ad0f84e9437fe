// Command cri-fake serves the fake container runtime that ships with Kubernetes (k8s.io/cri-client/pkg/fake,
// the one the kubelet's own tests and kubemark's hollow nodes use) on a unix socket, so that a real kubelet
// runs here without containerd. It keeps containers in memory; nothing is executed.
//
// Every CreateContainer request is also appended, as one JSON line, to the --record file: the container's
// environment, mounts, devices and annotations exactly as the kubelet asked the runtime to create it (what
// the device plugin's Allocate returned ends up there). The Tessera harness reads it.
//
//	cri-fake --listen /run/tessera-harness/cri.sock --record /tmp/containers.jsonl
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

type mount struct {
	Host      string `json:"host"`
	Container string `json:"container"`
	ReadOnly  bool   `json:"readonly"`
}

type device struct {
	Host        string `json:"host"`
	Container   string `json:"container"`
	Permissions string `json:"permissions"`
}

// record is one CreateContainer request, as the harness reads it.
type record struct {
	ID          string            `json:"id"`
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"podUID"`
	Container   string            `json:"container"`
	Attempt     uint32            `json:"attempt"`
	Env         map[string]string `json:"env"`
	Mounts      []mount           `json:"mounts"`
	Devices     []device          `json:"devices"`
	CDIDevices  []string          `json:"cdiDevices"`
	Annotations map[string]string `json:"annotations"`
	CPUSet      string            `json:"cpuset,omitempty"`
	Image       string            `json:"image"`
	Command     []string          `json:"command"`
	Args        []string          `json:"args"`
	RunAsUser   *int64            `json:"runAsUser,omitempty"`
	Privileged  bool              `json:"privileged"`
}

type recordingRuntime struct {
	*fake.RemoteRuntime
	mu  sync.Mutex
	out *os.File
}

func (r *recordingRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return resp, err
	}
	c := req.GetConfig()
	// The fake keeps no log path; a real runtime reports where the container's log is, and the kubelet removes
	// that path when it collects the container (an empty one would resolve against its working directory).
	r.RuntimeService.Lock()
	if fc, ok := r.RuntimeService.Containers[resp.GetContainerId()]; ok {
		fc.LogPath = filepath.Join(req.GetSandboxConfig().GetLogDirectory(), c.GetLogPath())
	}
	r.RuntimeService.Unlock()
	rec := record{
		ID:          resp.GetContainerId(),
		Namespace:   req.GetSandboxConfig().GetMetadata().GetNamespace(),
		Pod:         req.GetSandboxConfig().GetMetadata().GetName(),
		PodUID:      req.GetSandboxConfig().GetMetadata().GetUid(),
		Container:   c.GetMetadata().GetName(),
		Attempt:     c.GetMetadata().GetAttempt(),
		Env:         map[string]string{},
		Annotations: c.GetAnnotations(),
		CPUSet:      c.GetLinux().GetResources().GetCpusetCpus(),
		Image:       c.GetImage().GetImage(),
		Command:     c.GetCommand(),
		Args:        c.GetArgs(),
		Privileged:  c.GetLinux().GetSecurityContext().GetPrivileged(),
	}
	if u := c.GetLinux().GetSecurityContext().GetRunAsUser(); u != nil {
		v := u.GetValue()
		rec.RunAsUser = &v
	}
	for _, kv := range c.GetEnvs() {
		rec.Env[kv.GetKey()] = string(kv.GetValue())
	}
	for _, m := range c.GetMounts() {
		rec.Mounts = append(rec.Mounts, mount{m.GetHostPath(), m.GetContainerPath(), m.GetReadonly()})
	}
	for _, d := range c.GetDevices() {
		rec.Devices = append(rec.Devices, device{d.GetHostPath(), d.GetContainerPath(), d.GetPermissions()})
	}
	for _, d := range c.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	line, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.out.Write(append(line, '\n')); err != nil {
		return nil, fmt.Errorf("cri-fake: cannot record the container: %w", err)
	}
	return resp, nil
}

func main() {
	listen := flag.String("listen", "", "unix socket to serve the CRI on (the kubelet's --container-runtime-endpoint without unix://)")
	recordPath := flag.String("record", "", "file to append each CreateContainer request to, one JSON object a line")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: cri-fake --listen SOCKET --record FILE\n\n"+
			"Serves Kubernetes' fake container runtime (k8s.io/cri-client/pkg/fake) for a real kubelet,\n"+
			"and records every container the kubelet asks it to create.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *listen == "" || *recordPath == "" {
		flag.Usage()
		os.Exit(2)
	}
	out, err := os.OpenFile(*recordPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-fake: cannot open the record file: %v\n", err)
		os.Exit(1)
	}
	if err := os.Remove(*listen); err != nil && !os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "cri-fake: cannot remove the old socket %s: %v\n", *listen, err)
		os.Exit(1)
	}
	l, err := net.Listen("unix", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cri-fake: cannot listen on %s: %v\n", *listen, err)
		os.Exit(1)
	}
	rt := &recordingRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), out: out}
	// What fake.RemoteRuntime.Start would set: the runtime and its network are ready.
	rt.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	// Images "pull" at once; the kubelet refuses an image whose size is 0, as a real runtime never reports one.
	rt.ImageService.SetFakeImageSize(1 << 20)
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, rt)
	runtimeapi.RegisterImageServiceServer(server, rt.RemoteRuntime)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-stop
		server.Stop()
	}()
	fmt.Printf("cri-fake: serving on %s\n", *listen)
	if err := server.Serve(l); err != nil {
		fmt.Fprintf(os.Stderr, "cri-fake: %v\n", err)
		os.Exit(1)
	}
}

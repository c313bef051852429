// Command crihelper does the two things the harness (test/controlplane) and
// hack/controlplane/cluster.sh need from a node's CRI runtime that ctr does not do:
//
//	crihelper clean --endpoint SOCKET   stop and remove every pod sandbox, as `crictl rmp -fa`
//	crihelper image-ref NAME            print the fully qualified name the CRI looks NAME up by
//
// clean runs against a node's containerd after its kubelet has stopped: stopping a sandbox kills
// its containers, runs CNI DEL (the veth goes) and unmounts its network namespace and shm;
// removing it deletes the containers, their rootfs mounts and cgroups, and lets each shim exit.
//
// image-ref exists because an image imported with ctr keeps the name it has in the archive,
// while the CRI resolves a pod's short image name (gpuhealth/gpuhealth:0.1.0) to its normalized,
// registry-qualified form: the import is tagged with that form so the kubelet finds it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/distribution/reference"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	log.SetFlags(0)
	if err := run(os.Args[1:]); err != nil {
		log.Printf("crihelper: %v", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: crihelper clean --endpoint SOCKET | crihelper image-ref NAME")
	}
	switch args[0] {
	case "image-ref":
		if len(args) != 2 {
			return errors.New("usage: crihelper image-ref NAME")
		}
		ref, err := reference.ParseDockerRef(args[1])
		if err != nil {
			return fmt.Errorf("image name %q: %w", args[1], err)
		}
		fmt.Println(ref.String())
		return nil
	case "clean":
		fs := flag.NewFlagSet("clean", flag.ContinueOnError)
		endpoint := fs.String("endpoint", "", "the runtime's unix socket path")
		timeout := fs.Duration("timeout", time.Minute, "give up after this long")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		n, err := clean(ctx, *endpoint)
		if err != nil {
			return err
		}
		log.Printf("crihelper: removed %d pod sandboxes", n)
		return nil
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}
}

func clean(ctx context.Context, endpoint string) (int, error) {
	if endpoint == "" {
		return 0, errors.New("--endpoint is required")
	}
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	defer func() { _ = conn.Close() }()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, fmt.Errorf("list pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range resp.Items {
		what := fmt.Sprintf("pod sandbox %.12s (%s/%s)", sb.Id, sb.Metadata.GetNamespace(), sb.Metadata.GetName())
		if _, err := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop %s: %w", what, err))
			continue
		}
		if _, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", what, err))
		}
	}
	return len(resp.Items) - len(errs), errors.Join(errs...)
}

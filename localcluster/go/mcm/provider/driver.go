package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/gardener/machine-controller-manager/pkg/util/provider/driver"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/codes"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/machinecodes/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const (
	providerIDPrefix = "fake:///"
	// How long a new VM keeps trying to register its Node before giving up (the API server may be restarting).
	registrationPatience = 5 * time.Minute
	// Label Gardener's kubelets put on their Node; MCM uses it to find a Machine's Node.
	machineNameLabel = "node.gardener.cloud/machine-name"
)

// fakeVM is one VM of the fake cloud. Machines and their VMs share a name, and so do VMs and their Nodes.
type fakeVM struct {
	ProviderID string    `json:"providerID"`
	Class      string    `json:"class"`
	Created    time.Time `json:"created"`
}

// fakeDriver implements MCM's driver.Driver with VMs in memory (optionally mirrored to a state file) and
// plays the kubelet's registration: each new VM's Node appears, Ready, shortly after CreateMachine returned.
type fakeDriver struct {
	mu        sync.Mutex
	vms       map[string]fakeVM
	stateFile string
	nodes     kubernetes.Interface
	delay     time.Duration
}

var _ driver.Driver = (*fakeDriver)(nil)

func newFakeDriver(kubeconfig, stateFile string, delay time.Duration) (*fakeDriver, error) {
	if kubeconfig == "" {
		return nil, errors.New("no kubeconfig for the target cluster: pass --target-kubeconfig or FAKE_PROVIDER_KUBECONFIG")
	}
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	nodes, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	d := &fakeDriver{vms: map[string]fakeVM{}, stateFile: stateFile, nodes: nodes, delay: delay}
	if err := d.load(); err != nil {
		return nil, err
	}
	// VMs that outlived a restart of this process still boot: finish any registration the restart cut short.
	for name, vm := range d.vms {
		go d.registerNode(name, vm.ProviderID)
	}
	return d, nil
}

func (d *fakeDriver) CreateMachine(ctx context.Context, req *driver.CreateMachineRequest) (*driver.CreateMachineResponse, error) {
	if req.Machine == nil {
		return nil, status.Error(codes.InvalidArgument, "CreateMachine without a machine")
	}
	name := req.Machine.Name
	class := ""
	if req.MachineClass != nil {
		class = req.MachineClass.Name
	}
	d.mu.Lock()
	vm, exists := d.vms[name]
	if !exists {
		vm = fakeVM{ProviderID: providerIDPrefix + name, Class: class, Created: time.Now().UTC()}
		d.vms[name] = vm
		if err := d.saveLocked(); err != nil {
			delete(d.vms, name)
			d.mu.Unlock()
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	d.mu.Unlock()
	if !exists {
		klog.Infof("fake driver: created VM %s for machine %s", vm.ProviderID, name)
		// Registration runs on its own, after this call has returned, like a booting VM's kubelet.
		go d.registerNode(name, vm.ProviderID)
	}
	return &driver.CreateMachineResponse{ProviderID: vm.ProviderID, NodeName: name}, nil
}

func (d *fakeDriver) InitializeMachine(context.Context, *driver.InitializeMachineRequest) (*driver.InitializeMachineResponse, error) {
	return nil, status.Error(codes.Unimplemented, "the fake provider has no VM initialization")
}

func (d *fakeDriver) DeleteMachine(ctx context.Context, req *driver.DeleteMachineRequest) (*driver.DeleteMachineResponse, error) {
	if req.Machine == nil {
		return nil, status.Error(codes.InvalidArgument, "DeleteMachine without a machine")
	}
	name := req.Machine.Name
	d.mu.Lock()
	_, existed := d.vms[name]
	delete(d.vms, name)
	err := d.saveLocked()
	d.mu.Unlock()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if existed {
		klog.Infof("fake driver: deleted VM of machine %s", name)
	}
	// A VM that is gone takes its Node with it (the cloud's node lifecycle would).
	if err := d.nodes.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, status.Error(codes.Unavailable, fmt.Sprintf("deleting node %s: %v", name, err))
	}
	return &driver.DeleteMachineResponse{}, nil
}

func (d *fakeDriver) GetMachineStatus(ctx context.Context, req *driver.GetMachineStatusRequest) (*driver.GetMachineStatusResponse, error) {
	if req.Machine == nil {
		return nil, status.Error(codes.InvalidArgument, "GetMachineStatus without a machine")
	}
	name := req.Machine.Name
	d.mu.Lock()
	vm, exists := d.vms[name]
	d.mu.Unlock()
	if !exists {
		return nil, status.Error(codes.NotFound, fmt.Sprintf("no VM for machine %s", name))
	}
	return &driver.GetMachineStatusResponse{ProviderID: vm.ProviderID, NodeName: name}, nil
}

func (d *fakeDriver) ListMachines(ctx context.Context, req *driver.ListMachinesRequest) (*driver.ListMachinesResponse, error) {
	class := ""
	if req.MachineClass != nil {
		class = req.MachineClass.Name
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	listed := map[string]string{}
	for name, vm := range d.vms {
		if class == "" || vm.Class == class {
			listed[vm.ProviderID] = name
		}
	}
	return &driver.ListMachinesResponse{MachineList: listed}, nil
}

func (d *fakeDriver) GetVolumeIDs(context.Context, *driver.GetVolumeIDsRequest) (*driver.GetVolumeIDsResponse, error) {
	return &driver.GetVolumeIDsResponse{VolumeIDs: []string{}}, nil
}

// registerNode creates the VM's Node and reports it Ready, retrying until it worked or the VM is gone.
func (d *fakeDriver) registerNode(name, providerID string) {
	time.Sleep(d.delay)
	deadline := time.Now().Add(registrationPatience)
	for time.Now().Before(deadline) {
		d.mu.Lock()
		vm, exists := d.vms[name]
		d.mu.Unlock()
		if !exists || vm.ProviderID != providerID {
			return
		}
		err := d.createReadyNode(name, providerID)
		if err == nil {
			klog.Infof("fake driver: node %s registered", name)
			return
		}
		klog.Warningf("fake driver: registering node %s: %v (retrying)", name, err)
		time.Sleep(time.Second)
	}
	klog.Errorf("fake driver: gave up registering node %s", name)
}

func (d *fakeDriver) createReadyNode(name, providerID string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nodes := d.nodes.CoreV1().Nodes()
	node, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, err = nodes.Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name:   name,
				Labels: map[string]string{"kubernetes.io/hostname": name, machineNameLabel: name},
			},
			Spec: corev1.NodeSpec{ProviderID: providerID},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return err
	}
	if node.Spec.ProviderID != providerID {
		return fmt.Errorf("node %s belongs to %q, not %q", name, node.Spec.ProviderID, providerID)
	}
	for _, condition := range node.Status.Conditions {
		if condition.Type == corev1.NodeReady {
			return nil // reported once; from now on the test owns the node's health
		}
	}
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("2"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	status := corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}},
		Conditions: []corev1.NodeCondition{{
			Type:               corev1.NodeReady,
			Status:             corev1.ConditionTrue,
			Reason:             "KubeletReady",
			Message:            "fake kubelet is posting ready status",
			LastHeartbeatTime:  now,
			LastTransitionTime: now,
		}},
	}
	// A patch, not an update: MCM adds its finalizer to the new Node at the same time.
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = nodes.Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func (d *fakeDriver) load() error {
	if d.stateFile == "" {
		return nil
	}
	data, err := os.ReadFile(d.stateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, &d.vms); err != nil {
		return fmt.Errorf("state file %s: %w", d.stateFile, err)
	}
	names := make([]string, 0, len(d.vms))
	for name := range d.vms {
		names = append(names, name)
	}
	sort.Strings(names)
	klog.Infof("fake driver: %d VMs from %s: %v", len(names), d.stateFile, names)
	return nil
}

// saveLocked mirrors the VMs to the state file (write and rename, so a crash never leaves half a file).
func (d *fakeDriver) saveLocked() error {
	if d.stateFile == "" {
		return nil
	}
	data, err := json.MarshalIndent(d.vms, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(d.stateFile), ".vms-*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), d.stateFile)
}

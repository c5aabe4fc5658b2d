// Security policy of pdserve's Kubernetes manifests, on the rendered
// overlays (offline). Fails when any pod lacks a setting:
//   - pod: runAsNonRoot, a non-zero runAsUser, seccomp RuntimeDefault, no
//     service account token (but the SLO planner's, which must be its own
//     ServiceAccount and not the namespace's default), no host network/PID/IPC;
//   - every container (init containers too): no privilege escalation, not
//     privileged, read-only root filesystem, every capability dropped and
//     none added;
//   - NetworkPolicy: every pdserve pod is selected by an ingress policy;
//     the one port open to any source is the router's client port (grpc);
//     every other port admits only pods of the release or, for metrics, the
//     monitoring namespace; and each path pdserve needs stays open (workers'
//     grpc from the router, decode KV from prefill, metrics from Prometheus);
//   - images: the router runs the CPU image and no container is given
//     NVIDIA_* settings by the manifests; GPU workers get a memory-backed
//     /dev/shm and NCCL_SOCKET_IFNAME;
//   - NCCL (--kv_transport=nccl): a port range (endPort) admits only pods of
//     the release, each pool pins its ephemeral ports
//     (net.ipv4.ip_local_port_range) and the other pool can reach them.
//
//   node policy_check.mjs [--partial] [--rules IGNORED] FILE.yaml...
// --partial: the base files as written (no overlay): the GPU checks are
// skipped. Exit 0 when everything holds; 1 with one line per problem.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const problems = [];
const fail = (where, msg) => problems.push(`${where}: ${msg}`);
const args = process.argv.slice(2);
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--rules") ++i;
  else if (args[i] !== "--partial") files.push(args[i]);
}
const objects = files.flatMap((f) =>
  parseAllDocuments(readFileSync(f, "utf8")).map((d) => d.toJS()).filter((o) => o != null));
const byKind = (kind) => objects.filter((o) => o.kind === kind);
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

// Every pod template: Deployments (and any other workload kind added later).
const workloads = objects.filter((o) =>
  ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"].includes(o.kind));
const pods = workloads.map((w) => ({
  where: `${w.kind}/${w.metadata.name}`,
  labels: w.spec.template.metadata?.labels ?? {},
  spec: w.spec.template.spec,
}));
for (const p of byKind("Pod")) pods.push({ where: `Pod/${p.metadata.name}`, labels: p.metadata.labels ?? {}, spec: p.spec });
if (pods.length === 0) fail("manifests", "no pod templates found");

// 1. Pod and container security settings.
for (const { where, labels, spec } of pods) {
  const psc = spec.securityContext ?? {};
  const containers = [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
  const each = (get) => containers.every((c) => get(c.securityContext ?? {}));
  if (psc.runAsNonRoot !== true && !each((sc) => sc.runAsNonRoot === true)) fail(where, "runAsNonRoot is not true");
  if (psc.runAsUser === 0 || containers.some((c) => c.securityContext?.runAsUser === 0)) fail(where, "runs as uid 0");
  if (psc.seccompProfile?.type !== "RuntimeDefault" && !each((sc) => sc.seccompProfile?.type === "RuntimeDefault")) {
    fail(where, "no seccompProfile RuntimeDefault");
  }
  const planner = labels["app.kubernetes.io/component"] === "planner";
  if (spec.automountServiceAccountToken !== false && !planner) fail(where, "mounts a service account token");
  if (planner && (!spec.serviceAccountName || spec.serviceAccountName === "default")) {
    fail(where, "the planner runs as the namespace's default ServiceAccount");
  }
  for (const host of ["hostNetwork", "hostPID", "hostIPC"]) if (spec[host]) fail(where, `${host} is set`);
  for (const c of containers) {
    const cw = `${where} container ${c.name}`;
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false) fail(cw, "allowPrivilegeEscalation is not false");
    if (sc.privileged === true) fail(cw, "privileged");
    if (sc.readOnlyRootFilesystem !== true) fail(cw, "readOnlyRootFilesystem is not true");
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) fail(cw, "capabilities are not all dropped");
    if ((sc.capabilities?.add ?? []).length > 0) fail(cw, `adds capabilities ${sc.capabilities.add}`);
  }
}

// 2. NetworkPolicy. Sources of a rule, as kinds: "any", "release" (pods of
// this release by podSelector), "monitoring" (the monitoring namespace),
// "other".
const policies = byKind("NetworkPolicy").filter((np) => (np.spec.policyTypes ?? ["Ingress"]).includes("Ingress"));
const sourceKinds = (rule) => {
  if (!rule.from || rule.from.length === 0) return [{ kind: "any" }];
  return rule.from.map((f) => {
    if (f.ipBlock) return { kind: "any" };
    if (f.namespaceSelector) {
      const ns = f.namespaceSelector.matchLabels?.["kubernetes.io/metadata.name"];
      return { kind: ns === "monitoring" && !f.podSelector ? "monitoring" : "other" };
    }
    if (f.podSelector) {
      const sel = f.podSelector.matchLabels ?? {};
      return { kind: sel["app.kubernetes.io/part-of"] === "pdserve" ? "release" : "other", selector: sel };
    }
    return { kind: "other" };
  });
};
const portMatches = (rulePorts, port) =>
  !rulePorts || rulePorts.length === 0 ||
  rulePorts.some((rp) => rp.port === undefined || rp.port === port.containerPort || rp.port === port.name);
const podOf = (component) => pods.find((p) => p.labels["app.kubernetes.io/component"] === component);

for (const pod of pods) {
  const selecting = policies.filter((np) => matches(np.spec.podSelector?.matchLabels, pod.labels));
  if (selecting.length === 0) {
    fail(pod.where, "no ingress NetworkPolicy selects it");
    continue;
  }
  const component = pod.labels["app.kubernetes.io/component"];
  for (const c of pod.spec.containers) {
    for (const port of c.ports ?? []) {
      const pw = `${pod.where} port ${port.name ?? port.containerPort}`;
      const sources = selecting.flatMap((np) =>
        (np.spec.ingress ?? []).filter((r) => portMatches(r.ports, port)).flatMap(sourceKinds));
      const kinds = new Set(sources.map((s) => s.kind));
      const clientPort = component === "router" && port.name === "grpc";
      if (kinds.has("any") && !clientPort) fail(pw, "is open to any source; only the router's client port may be");
      if (kinds.has("other")) fail(pw, "admits sources outside the release and the monitoring namespace");
      if (kinds.has("monitoring") && port.name !== "metrics") fail(pw, "admits the monitoring namespace on a non-metrics port");
      if (port.name === "metrics" && !kinds.has("monitoring")) fail(pw, "Prometheus (namespace monitoring) cannot scrape it");
      if (clientPort && !kinds.has("any")) fail(pw, "clients cannot reach the router's client port");
      const from = (comp) => sources.some((s) => s.kind === "release" && matches(s.selector, podOf(comp)?.labels));
      if (component !== "router" && port.name === "grpc" && !from("router")) fail(pw, "the router cannot reach it");
      if (component === "decode" && port.name === "kv" && !from("prefill")) fail(pw, "prefill workers cannot send KV to it");
    }
  }
}

// NCCL between the GPU pools: port ranges admit only the release, and each
// nccl worker's ephemeral range (where NCCL listens) is open to the other pool.
for (const np of policies) {
  for (const rule of np.spec.ingress ?? []) {
    for (const p of rule.ports ?? []) {
      if (p.endPort !== undefined && sourceKinds(rule).some((s) => s.kind !== "release")) {
        fail(`NetworkPolicy/${np.metadata.name}`, `ports ${p.port}-${p.endPort} admit sources outside the release`);
      }
    }
  }
}
for (const pod of pods) {
  if (!pod.spec.containers.some((c) => (c.args ?? []).includes("--kv_transport=nccl"))) continue;
  const range = (pod.spec.securityContext?.sysctls ?? []).find((s) => s.name === "net.ipv4.ip_local_port_range");
  if (!range) {
    fail(pod.where, "--kv_transport=nccl without a pinned net.ipv4.ip_local_port_range (where NCCL listens)");
    continue;
  }
  const [lo, hi] = String(range.value).trim().split(/\s+/).map(Number);
  const peer = pod.labels["app.kubernetes.io/component"] === "decode" ? "prefill" : "decode";
  const open = policies
    .filter((np) => matches(np.spec.podSelector?.matchLabels, pod.labels))
    .some((np) => (np.spec.ingress ?? []).some((r) =>
      (r.ports ?? []).some((p) => p.port <= lo && (p.endPort ?? p.port) >= hi) &&
      sourceKinds(r).some((s) => s.kind === "release" && matches(s.selector, podOf(peer)?.labels))));
  if (!open) fail(pod.where, `the ${peer} pool cannot reach its NCCL ports ${lo}-${hi}`);
}

// 3. Images and GPU settings.
const partial = args.includes("--partial");
for (const { where, labels, spec } of pods) {
  for (const c of spec.containers) {
    const env = c.env ?? [];
    if (["router", "planner"].includes(labels["app.kubernetes.io/component"])) {
      if (!/^pdserve-cpu(:|$)/.test(c.image)) fail(where, `runs ${c.image}, not the CPU image`);
      if (env.some((e) => e.name.startsWith("NVIDIA_"))) fail(where, "is given NVIDIA_* settings");
      if (c.resources?.limits?.["nvidia.com/gpu"]) fail(where, "requests a GPU");
    }
    if (env.some((e) => e.name === "NVIDIA_VISIBLE_DEVICES")) {
      fail(where, "sets NVIDIA_VISIBLE_DEVICES (the device plugin sets it to the pod's GPUs)");
    }
    if (!partial && c.resources?.limits?.["nvidia.com/gpu"]) {
      const shm = (c.volumeMounts ?? []).find((m) => m.mountPath === "/dev/shm");
      const vol = shm && (spec.volumes ?? []).find((v) => v.name === shm.name);
      if (vol?.emptyDir?.medium !== "Memory") fail(where, "a GPU worker without a memory-backed /dev/shm (NCCL)");
      if (!env.some((e) => e.name === "NCCL_SOCKET_IFNAME")) fail(where, "a GPU worker without NCCL_SOCKET_IFNAME");
    }
  }
}

console.log(`${pods.length} pod templates, ${policies.length} ingress NetworkPolicies checked`);
if (problems.length > 0) {
  for (const p of problems) console.log(`FAIL ${p}`);
  process.exit(1);
}
console.log("OK");

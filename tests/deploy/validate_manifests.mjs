// Validates pdserve's Kubernetes manifests offline: every object against its
// Kubernetes (kubernetes-models) or CRD (@kubernetes-models/keda,
// @kubernetes-models/prometheus-operator) schema, strictly: a field the
// schema does not define is an error, as with `kubectl apply`'s default
// strict field validation (the packages' validators accept unknown fields,
// so the fields each validator reads are recorded and the rest reported).
// Then pdserve's own invariants across objects:
//   - images are referenced by name only (no registry);
//   - every process is probed over grpc.health.v1 on its gRPC port;
//   - terminationGracePeriodSeconds covers preStop + --drain_timeout_ms + 2 s
//     (server close) with a margin, and liveness cannot kill a draining pod;
//   - every worker sets --threads, equal to its container's CPU limit and
//     request (0, all cores of the node, would not match any limit);
//   - Services, PodDisruptionBudgets, ServiceMonitors and ScaledObjects
//     select or target objects that exist; workers' ROUTER_ADDRESS names the
//     router Service and its internal port (worker registration);
//   - every pdserve container mounts the cluster-token Secret and passes
//     --cluster_token_file from it;
//   - KEDA fails safe: every Prometheus trigger treats an empty answer as an
//     error (ignoreNullValues "false", KEDA's default being "true") and every
//     ScaledObject has a fallback; prefill scales on queued tokens;
//   - at most one autoscaler per pool: KEDA or the SLO planner, never both;
//     the planner is one Recreate replica, probed on its metrics port, with
//     its own ServiceAccount bound to a Role that allows only get and patch
//     of deployments/scale on the two pools (no ClusterRole anywhere);
//   - the security policy is tests/deploy/policy_check.mjs's;
//   - the PrometheusRule's spec equals deploy/prometheus/pdserve.rules.yml.
//
//   node validate_manifests.mjs [--rules RULES.yml] [--partial] FILE.yaml...
//
// --partial: the files are the kustomize base as written (kubectl absent):
// cross-object checks that need the overlays (resources, --threads) are
// skipped. Exit 0 when everything holds; 1 with one line per problem.
import { readFileSync } from "node:fs";
import { isDeepStrictEqual } from "node:util";
import { parseAllDocuments } from "yaml";

const kModules = {
  v1: "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "autoscaling/v2": "kubernetes-models/autoscaling/v2",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
  "keda.sh/v1alpha1": "@kubernetes-models/keda/keda.sh/v1alpha1",
  "rbac.authorization.k8s.io/v1": "kubernetes-models/rbac.authorization.k8s.io/v1",
};
const kDrainMarginSeconds = 5;  // beyond preStop + drain + the 2 s server close
const kServerCloseSeconds = 2;  // Shutdown() deadline in every main.cc

const problems = [];
const fail = (where, msg) => problems.push(`${where}: ${msg}`);

const args = process.argv.slice(2);
let rulesPath = null;
let partial = false;
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--rules") rulesPath = args[++i];
  else if (args[i] === "--partial") partial = true;
  else files.push(args[i]);
}
if (files.length === 0) {
  console.error("usage: validate_manifests.mjs [--rules RULES.yml] [--partial] FILE.yaml...");
  process.exit(2);
}

const objects = [];
for (const file of files) {
  for (const doc of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (doc.errors.length > 0) {
      fail(file, `YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj == null) continue;
    objects.push({ file, obj });
  }
}

// 1. Schemas. The compiled validators read every property their schema
// defines (and enumerate the keys of free-form maps such as labels), so a
// key of the object that the validator never read is unknown to the schema.
function tracked(value, path, visited) {
  if (value === null || typeof value !== "object") return value;
  const read = new Set();
  visited.push({ path, value, read });
  const children = new Map();
  return new Proxy(value, {
    get(target, key, receiver) {
      const v = Reflect.get(target, key, receiver);
      if (typeof key !== "string") return v;
      read.add(key);
      if (v === null || typeof v !== "object") return v;
      if (!children.has(key)) children.set(key, tracked(v, `${path}/${key}`, visited));
      return children.get(key);
    },
    ownKeys(target) {
      const keys = Reflect.ownKeys(target);
      for (const k of keys) if (typeof k === "string") read.add(k);
      return keys;
    },
  });
}

for (const { file, obj } of objects) {
  const where = `${file}: ${obj.kind}/${obj.metadata?.name}`;
  const base = kModules[obj.apiVersion];
  if (!base) {
    fail(where, `no schema known for apiVersion ${obj.apiVersion}`);
    continue;
  }
  let model;
  try {
    model = (await import(`${base}/${obj.kind}`))[obj.kind];
    if (typeof model !== "function") throw new Error("no model class");
  } catch (e) {
    fail(where, `no schema for kind ${obj.kind} in ${obj.apiVersion}`);
    continue;
  }
  const visited = [];
  try {
    model.prototype.validate.call(tracked(obj, "", visited));
  } catch (e) {
    fail(where, `schema: ${e.message}`);
    continue;
  }
  for (const { path, value, read } of visited) {
    if (Array.isArray(value)) continue;
    for (const key of Object.keys(value)) {
      if (!read.has(key)) fail(where, `schema: unknown field ${path}/${key}`);
    }
  }
}

// 2. pdserve invariants.
const byKind = (kind) => objects.filter((o) => o.obj.kind === kind).map((o) => o.obj);
const matches = (selector, labels) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);
const flagValue = (args, name) => {
  let value;
  for (const a of args ?? []) if (a.startsWith(`--${name}=`)) value = a.slice(name.length + 3);
  return value;  // the last one wins, as with absl flags
};
const cpuCores = (q) => (q == null ? undefined : String(q).endsWith("m") ? parseInt(q, 10) / 1000 : Number(q));

const deployments = byKind("Deployment");
const services = byKind("Service");
const isPlanner = (d) => d.spec.template.metadata?.labels?.["app.kubernetes.io/component"] === "planner";
for (const d of deployments) {
  const where = `Deployment/${d.metadata.name}`;
  if (isPlanner(d)) continue;  // checked below: not a serving process
  const pod = d.spec.template.spec;
  if (!matches(d.spec.selector.matchLabels, d.spec.template.metadata?.labels)) {
    fail(where, "selector does not match the pod template's labels");
  }
  const grace = pod.terminationGracePeriodSeconds ?? 30;
  for (const c of pod.containers) {
    const cw = `${where} container ${c.name}`;
    if (/[/@]/.test(c.image.split(":")[0])) fail(cw, `image ${c.image} is not referenced by name only`);
    const grpcPort = c.ports?.find((p) => p.name === "grpc")?.containerPort;
    if (grpcPort == null) fail(cw, "no container port named grpc");
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      if (c[probe]?.grpc?.port !== grpcPort) fail(cw, `${probe} is not a grpc probe on the gRPC port ${grpcPort}`);
    }
    if (flagValue(c.args, "port") !== String(grpcPort)) fail(cw, `--port is not the gRPC port ${grpcPort}`);
    const metricsPort = c.ports?.find((p) => p.name === "metrics")?.containerPort;
    if (flagValue(c.args, "metrics_port") !== String(metricsPort)) fail(cw, "--metrics_port is not the metrics port");
    const drainMs = Number(flagValue(c.args, "drain_timeout_ms"));
    if (!(drainMs > 0)) fail(cw, "no --drain_timeout_ms");
    const sleep = c.lifecycle?.preStop?.exec?.command;
    const preStop = sleep?.[0] === "sleep" ? Number(sleep[1]) : NaN;
    if (!(preStop > 0)) fail(cw, "preStop is not a short sleep");
    const needed = preStop + drainMs / 1000 + kServerCloseSeconds + kDrainMarginSeconds;
    if (grace < needed) {
      fail(cw, `terminationGracePeriodSeconds ${grace} < preStop ${preStop} + drain ${drainMs / 1000} + close ${kServerCloseSeconds} + margin ${kDrainMarginSeconds}`);
    }
    const live = c.livenessProbe ?? {};
    if ((live.periodSeconds ?? 10) * (live.failureThreshold ?? 3) <= grace) {
      fail(cw, "liveness periodSeconds x failureThreshold does not outlast the grace period (a draining pod is NOT_SERVING)");
    }
    const threads = flagValue(c.args, "threads");
    const cpuLimit = cpuCores(c.resources?.limits?.cpu);
    if (!partial && threads !== undefined && cpuLimit !== undefined && Number(threads) !== cpuLimit) {
      fail(cw, `--threads=${threads} but the CPU limit is ${cpuLimit}`);
    }
    // Whole cores for every compute thread: requests = limits (Guaranteed QoS).
    const cpuRequest = cpuCores(c.resources?.requests?.cpu);
    if (!partial && threads !== undefined && cpuLimit !== undefined && cpuRequest !== cpuLimit) {
      fail(cw, `--threads=${threads} with a CPU request of ${cpuRequest} but a limit of ${cpuLimit}`);
    }
    const backend = flagValue(c.args, "backend");
    if (backend === "cuda" && !c.resources?.limits?.["nvidia.com/gpu"]) fail(cw, "--backend=cuda without an nvidia.com/gpu limit");
    if (c.resources?.limits?.["nvidia.com/gpu"] && backend !== "cuda") fail(cw, "a GPU but not --backend=cuda");
  }
  if (!partial && d.metadata.name !== "pdserve-router" && !isPlanner(d)) {
    const c = pod.containers[0];
    if (!flagValue(c.args, "backend")) fail(where, "the overlay sets no --backend");
    if (!c.resources?.requests) fail(where, "the overlay sets no resource requests");
    const threads = Number(flagValue(c.args, "threads"));
    if (!(threads > 0)) fail(where, "no --threads: 0 would use every core of the node, whatever its CPU limit");
    if (cpuCores(c.resources?.limits?.cpu) === undefined) fail(where, "no CPU limit for its --threads");
  }
}

for (const s of services) {
  const where = `Service/${s.metadata.name}`;
  const target = deployments.find((d) => matches(s.spec.selector, d.spec.template.metadata?.labels));
  if (!target) {
    fail(where, "selects no Deployment's pods");
    continue;
  }
  const ports = target.spec.template.spec.containers.flatMap((c) => c.ports ?? []);
  for (const p of s.spec.ports) {
    if (!ports.some((cp) => cp.name === p.targetPort || cp.containerPort === p.targetPort)) {
      fail(where, `port ${p.name} targets ${p.targetPort}, which ${target.metadata.name} does not expose`);
    }
  }
}

for (const pdb of byKind("PodDisruptionBudget")) {
  if (!deployments.some((d) => matches(pdb.spec.selector.matchLabels, d.spec.template.metadata?.labels))) {
    fail(`PodDisruptionBudget/${pdb.metadata.name}`, "selects no Deployment's pods");
  }
}
for (const pool of ["pdserve-prefill", "pdserve-decode"]) {
  const d = deployments.find((x) => x.metadata.name === pool);
  if (!d) {
    fail(pool, "missing Deployment");
    continue;
  }
  if (!byKind("PodDisruptionBudget").some((p) => matches(p.spec.selector.matchLabels, d.spec.template.metadata.labels))) {
    fail(pool, "no PodDisruptionBudget");
  }
  const keda = byKind("ScaledObject").filter((so) => so.spec.scaleTargetRef.name === pool);
  const planners = deployments.filter(isPlanner);
  if (keda.length + planners.length > 1) fail(pool, `scaled by ${keda.length} ScaledObject(s) and ${planners.length} planner(s): one autoscaler at most`);
}

// The SLO planner: one replica, its own identity, the least RBAC.
const roles = byKind("Role");
const bindings = byKind("RoleBinding");
for (const kind of ["ClusterRole", "ClusterRoleBinding"]) {
  for (const o of byKind(kind)) fail(`${kind}/${o.metadata.name}`, "pdserve needs no cluster-wide permission");
}
for (const d of deployments.filter(isPlanner)) {
  const where = `Deployment/${d.metadata.name}`;
  const pod = d.spec.template.spec;
  const c = pod.containers[0];
  if (d.spec.replicas !== 1 || d.spec.strategy?.type !== "Recreate") fail(where, "not one Recreate replica (two planners would fight)");
  const metricsPort = c.ports?.find((p) => p.name === "metrics")?.containerPort;
  if (flagValue(c.args, "metrics_port") !== String(metricsPort)) fail(where, "--metrics_port is not the metrics port");
  for (const probe of ["readinessProbe", "livenessProbe"]) {
    if (c[probe]?.httpGet?.port !== metricsPort || c[probe]?.httpGet?.path !== "/healthz") fail(where, `${probe} is not GET /healthz on the metrics port`);
  }
  if (flagValue(c.args, "actuator") !== "kubernetes") fail(where, "--actuator is not kubernetes");
  if (!c.resources?.limits?.cpu || !c.resources?.limits?.memory) fail(where, "no CPU and memory limits");
  const sa = pod.serviceAccountName;
  if (!sa || sa === "default") fail(where, "runs as the default ServiceAccount");
  if (!byKind("ServiceAccount").some((a) => a.metadata.name === sa)) fail(where, `no ServiceAccount ${sa}`);
  const bound = bindings.filter((b) => (b.subjects ?? []).some((s) => s.kind === "ServiceAccount" && s.name === sa));
  if (bound.length === 0) fail(where, `ServiceAccount ${sa} is bound to no Role`);
  const pools = [flagValue(c.args, "prefill_deployment") ?? "pdserve-prefill", flagValue(c.args, "decode_deployment") ?? "pdserve-decode"];
  for (const p of pools) if (!deployments.some((x) => x.metadata.name === p)) fail(where, `scales ${p}, which does not exist`);
  for (const b of bound) {
    const role = b.roleRef.kind === "Role" && roles.find((r) => r.metadata.name === b.roleRef.name);
    if (!role) {
      fail(`RoleBinding/${b.metadata.name}`, `binds ${b.roleRef.kind} ${b.roleRef.name}, not a Role of the release`);
      continue;
    }
    for (const rule of role.rules ?? []) {
      const rw = `Role/${role.metadata.name}`;
      if (JSON.stringify(rule.apiGroups) !== '["apps"]' || JSON.stringify(rule.resources) !== '["deployments/scale"]') {
        fail(rw, `grants ${rule.resources} in ${rule.apiGroups}: only apps deployments/scale is needed`);
      }
      if ((rule.verbs ?? []).some((v) => !["get", "patch"].includes(v))) fail(rw, `grants verbs ${rule.verbs}: only get and patch are needed`);
      const names = rule.resourceNames ?? [];
      if (names.length === 0 || names.some((n) => !pools.includes(n))) fail(rw, `resourceNames ${names} are not exactly the pools ${pools}`);
    }
  }
}

for (const sm of byKind("ServiceMonitor")) {
  const where = `ServiceMonitor/${sm.metadata.name}`;
  const svc = services.find((s) => matches(sm.spec.selector.matchLabels, s.metadata.labels));
  if (!svc) {
    fail(where, "selects no Service");
    continue;
  }
  for (const ep of sm.spec.endpoints) {
    if (!svc.spec.ports.some((p) => p.name === ep.port)) fail(where, `Service ${svc.metadata.name} has no port ${ep.port}`);
  }
  if (sm.spec.jobLabel && !svc.metadata.labels?.[sm.spec.jobLabel]) fail(where, `Service has no label ${sm.spec.jobLabel}`);
}
for (const component of ["router", "prefill", "decode"]) {
  const svc = services.find((s) => s.metadata.labels?.["app.kubernetes.io/component"] === component);
  if (!svc || !byKind("ServiceMonitor").some((sm) => matches(sm.spec.selector.matchLabels, svc.metadata.labels))) {
    fail(component, "not scraped by any ServiceMonitor");
  }
}

for (const so of byKind("ScaledObject")) {
  const where = `ScaledObject/${so.metadata.name}`;
  if (!deployments.some((d) => d.metadata.name === so.spec.scaleTargetRef.name)) fail(where, "targets no Deployment");
  for (const t of so.spec.triggers) {
    if (t.type === "prometheus" && !/pdserve_/.test(t.metadata.query ?? "")) fail(where, `trigger ${t.name} queries no pdserve metric`);
    // The CRD leaves these free-form; KEDA's admission webhook rejects others.
    if (t.metricType !== undefined && !["AverageValue", "Value", "Utilization"].includes(t.metricType)) {
      fail(where, `trigger ${t.name}: metricType ${t.metricType} is not AverageValue, Value or Utilization`);
    }
    if (t.type === "prometheus" && !(Number(t.metadata.threshold) > 0)) fail(where, `trigger ${t.name}: threshold is not a positive number`);
    // An empty answer (a broken scrape) must not read as 0 and scale down.
    if (t.type === "prometheus" && t.metadata.ignoreNullValues !== "false") {
      fail(where, `trigger ${t.name}: ignoreNullValues is not "false" (an empty query would read as 0)`);
    }
    if (so.spec.fallback && t.metricType !== "AverageValue") fail(where, `trigger ${t.name}: fallback needs AverageValue`);
  }
  if (!(so.spec.fallback?.replicas >= 1)) fail(where, "no fallback for a failing query");
  if (so.spec.scaleTargetRef.name === "pdserve-prefill" &&
      !so.spec.triggers.some((t) => /pdserve_prefill_queued_tokens/.test(t.metadata.query ?? ""))) {
    fail(where, "prefill does not scale on queued tokens");
  }
}

for (const cm of byKind("ConfigMap")) {
  const address = cm.data?.ROUTER_ADDRESS;
  if (address === undefined) continue;
  const [host, port] = address.split(":");
  const svc = services.find((s) => s.metadata.name === host.split(".")[0]);
  if (!svc || !svc.spec.ports.some((p) => String(p.port) === port && p.name === "internal")) {
    fail(`ConfigMap/${cm.metadata.name}`, `ROUTER_ADDRESS ${address} is not the router Service's internal port`);
  }
}

for (const d of byKind("Deployment").filter((x) => !isPlanner(x))) {
  const pod = d.spec.template.spec;
  const volume = (pod.volumes ?? []).find((v) => v.secret?.secretName === "pdserve-cluster-token");
  if (!byKind("Secret").some((s) => s.metadata.name === "pdserve-cluster-token")) {
    fail(`Deployment/${d.metadata.name}`, "no Secret pdserve-cluster-token");
  }
  for (const c of pod.containers) {
    const where = `Deployment/${d.metadata.name} container ${c.name}`;
    const mount = volume && (c.volumeMounts ?? []).find((m) => m.name === volume.name);
    const flag = (c.args ?? []).find((a) => a.startsWith("--cluster_token_file="));
    if (!mount || !flag || !flag.slice("--cluster_token_file=".length).startsWith(mount.mountPath + "/")) {
      fail(where, "does not read --cluster_token_file from the mounted pdserve-cluster-token Secret");
    }
  }
}

if (rulesPath) {
  const rules = parseAllDocuments(readFileSync(rulesPath, "utf8"))[0].toJS();
  const pr = byKind("PrometheusRule").find((r) => r.metadata.name === "pdserve");
  if (!pr) fail("PrometheusRule/pdserve", "missing");
  else if (!isDeepStrictEqual(pr.spec, rules)) {
    fail("PrometheusRule/pdserve", `spec differs from ${rulesPath}: run deploy/k8s/gen_prometheusrule.sh`);
  }
}

const kinds = {};
for (const { obj } of objects) kinds[obj.kind] = (kinds[obj.kind] ?? 0) + 1;
console.log(`${objects.length} objects from ${files.length} file(s): ${JSON.stringify(kinds)}`);
if (problems.length > 0) {
  for (const p of problems) console.log(`FAIL ${p}`);
  process.exit(1);
}
console.log(partial ? "OK (base files as written; overlays not applied)" : "OK");

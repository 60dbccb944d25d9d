-- Argo CD health check for specdec.io/SpeculativeModel.
-- Install as argocd-cm key resource.customizations.health.specdec.io_SpeculativeModel (see docs/gitops.md).
-- Argo CD hands the live object over as `obj` and reads back {status = ..., message = ...}.
-- Written for Lua 5.1 and the standard libraries Argo CD allows: ipairs, string, tostring.

local function find_condition(conditions, wanted)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == wanted then
      return condition
    end
  end
  return nil
end

local function explain(condition, fallback)
  if condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  if condition.reason ~= nil and condition.reason ~= "" then
    return condition.reason
  end
  return fallback
end

local status = obj.status
if status == nil then
  return { status = "Progressing", message = "Waiting for the operator to observe this SpeculativeModel" }
end

-- Until the operator has reconciled the current generation, every condition describes an older spec.
local generation = (obj.metadata or {}).generation or 0
local observed = status.observedGeneration or 0
if observed < generation then
  return {
    status = "Progressing",
    message = string.format("Waiting for the operator to observe generation %d (observed %d)", generation, observed),
  }
end

local conditions = status.conditions
local degraded = find_condition(conditions, "Degraded")
if degraded ~= nil and degraded.status == "True" then
  return { status = "Degraded", message = explain(degraded, "Degraded") }
end

-- A paused canary waits for a person; Argo CD's Suspended says exactly that.
local canary = status.canary
if canary ~= nil and (canary.phase == "Paused" or canary.phase == "Progressing") then
  local where = string.format(
    "canary %s at step %d with %d%% of traffic",
    tostring(canary.canaryRevision),
    (canary.step or 0) + 1,
    canary.weight or 0
  )
  if canary.phase == "Paused" then
    return { status = "Suspended", message = "Paused: " .. where }
  end
  return { status = "Progressing", message = "Rolling out: " .. where }
end

local progressing = find_condition(conditions, "Progressing")
if progressing ~= nil and progressing.status == "True" then
  return { status = "Progressing", message = explain(progressing, "Progressing") }
end

local ready = find_condition(conditions, "Ready")
if ready ~= nil then
  -- 0 is the API's "not recorded"; a recorded older generation means Ready speaks of an older spec.
  local ready_generation = ready.observedGeneration or 0
  if ready_generation > 0 and ready_generation < generation then
    return {
      status = "Progressing",
      message = string.format("Ready reflects generation %d, not %d yet", ready_generation, generation),
    }
  end
  if ready.status == "True" then
    -- Reduced (a drafter fallback, a gfx target skipped for want of nodes) serves: Healthy, and say what.
    local reduced = find_condition(conditions, "Reduced")
    if reduced ~= nil and reduced.status == "True" then
      return {
        status = "Healthy",
        message = explain(ready, "Ready") .. "; reduced (" .. tostring(reduced.reason) .. "): " .. explain(reduced, ""),
      }
    end
    return { status = "Healthy", message = explain(ready, "Ready") }
  end
  return { status = "Progressing", message = explain(ready, "Not ready") }
end
return { status = "Progressing", message = "Waiting for the Ready condition" }

//! The exhaustive check: every reachable state, breadth first (so each counterexample is a
//! shortest one), the `always` properties in each, and liveness under weak fairness.
//!
//! Liveness ("every terminating PeerPod is released once the faults stop") is checked on the
//! graph of fault-free transitions among the states where a PeerPod is still terminating: a
//! strongly connected component of it that the fair actors cannot leave (each fair group is
//! either taken inside it or not always enabled in it) is a way to stay there forever, and so
//! is a state where no fair actor can act. stateright's own `eventually` only looks at terminal
//! states, and the engine's waits make cycles, so the check is done here.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};

use stateright::{Expectation, Model};

use crate::{Action, DeletionProtocol, State, fair_group, is_fault, nothing_terminating};

/// A property that does not hold, and the shortest run to a state that breaks it.
#[derive(Debug, Clone)]
pub struct Counterexample {
    pub property: &'static str,
    /// The actions from the initial state.
    pub path: Vec<Action>,
    /// For a liveness counterexample: the actions of a cycle the run can then repeat forever
    /// (empty when it stops).
    pub cycle: Vec<Action>,
    pub last: State,
}

impl Counterexample {
    /// Its length in steps (the path, and the cycle once).
    pub fn len(&self) -> usize {
        self.path.len() + self.cycle.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Display for Counterexample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} ({} steps):", self.property, self.len())?;
        for action in &self.path {
            writeln!(f, "  {action:?}")?;
        }
        if !self.cycle.is_empty() {
            writeln!(f, "  then forever:")?;
            for action in &self.cycle {
                writeln!(f, "    {action:?}")?;
            }
        }
        write!(f, "  ending in {:?}", self.last)
    }
}

/// What the exploration found.
#[derive(Debug, Default)]
pub struct Report {
    pub states: usize,
    pub transitions: usize,
    /// Broken properties, each with its shortest counterexample.
    pub broken: Vec<Counterexample>,
    /// `sometimes` properties reached.
    pub reached: Vec<&'static str>,
}

impl Report {
    pub fn broken(&self, property: &str) -> Option<&Counterexample> {
        self.broken.iter().find(|c| c.property == property)
    }

    /// Every counterexample, for a failure message.
    pub fn describe(&self) -> String {
        let mut text = String::new();
        for c in &self.broken {
            let _ = writeln!(text, "{c}");
        }
        text
    }
}

const ROOT: u32 = u32::MAX;

/// Explores every state of `model`, checking its properties and liveness; stops at the first
/// broken `always` property.
pub fn explore(model: &DeletionProtocol) -> Report {
    let properties = model.properties();
    let mut states: Vec<State> = Vec::new();
    // States by fingerprint (64 bits: a collision among a few million states is about as
    // likely as a cosmic ray), so that each is kept once.
    let mut index: HashMap<u64, u32> = HashMap::new();
    let mut parent: Vec<(u32, Option<Action>)> = Vec::new();
    // Fault-free edges (target, fair group) and the fair groups enabled, per state.
    let mut edges: Vec<Vec<(u32, Option<u32>)>> = Vec::new();
    let mut enabled: Vec<u32> = Vec::new();
    let mut report = Report::default();
    let mut found: Vec<bool> = vec![false; properties.len()];
    for init in model.init_states() {
        if let std::collections::hash_map::Entry::Vacant(e) = index.entry(fingerprint(&init)) {
            e.insert(states.len() as u32);
            states.push(init);
            parent.push((ROOT, None));
        }
    }
    let mut next = 0;
    let mut actions = Vec::new();
    while next < states.len() {
        let id = next as u32;
        next += 1;
        if next % 200_000 == 0 && std::env::var_os("MODEL_PROGRESS").is_some() {
            eprintln!("{next} of {} states", states.len());
        }
        let state = states[id as usize].clone();
        for (i, property) in properties.iter().enumerate() {
            if found[i] {
                continue;
            }
            let holds = (property.condition)(model, &state);
            match property.expectation {
                Expectation::Always if !holds => {
                    found[i] = true;
                    report.broken.push(Counterexample {
                        property: property.name,
                        path: path_to(&parent, id),
                        cycle: Vec::new(),
                        last: state.clone(),
                    });
                    report.states = states.len();
                    return report;
                }
                Expectation::Sometimes if holds => {
                    found[i] = true;
                    report.reached.push(property.name);
                }
                _ => {}
            }
        }
        actions.clear();
        model.actions(&state, &mut actions);
        let mut out = Vec::new();
        let mut groups = 0u32;
        for &action in &actions {
            let Some(successor) = model.next_state(&state, action) else {
                continue;
            };
            report.transitions += 1;
            let fault = is_fault(action);
            let target = match index.entry(fingerprint(&successor)) {
                std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let t = states.len() as u32;
                    e.insert(t);
                    states.push(successor);
                    parent.push((id, Some(action)));
                    t
                }
            };
            if !fault {
                let group = fair_group(action);
                if let Some(g) = group {
                    groups |= 1 << g;
                }
                out.push((target, group));
            }
        }
        edges.push(out);
        enabled.push(groups);
    }
    drop(index);
    report.states = states.len();
    if let Some(c) = liveness(model, &states, &parent, &edges, &enabled) {
        report.broken.push(c);
    }
    report
}

fn fingerprint(state: &State) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    state.hash(&mut hasher);
    hasher.finish()
}

fn path_to(parent: &[(u32, Option<Action>)], mut id: u32) -> Vec<Action> {
    let mut path = Vec::new();
    while let (p, Some(action)) = parent[id as usize] {
        path.push(action);
        id = p;
    }
    path.reverse();
    path
}

/// The shortest way (by BFS order of its entry) to stay with a PeerPod terminating forever once
/// the faults stop, if there is one.
fn liveness(
    model: &DeletionProtocol,
    states: &[State],
    parent: &[(u32, Option<Action>)],
    edges: &[Vec<(u32, Option<u32>)>],
    enabled: &[u32],
) -> Option<Counterexample> {
    let bad = |id: u32| !nothing_terminating(&states[id as usize]);
    let component = tarjan(states.len(), |v| {
        if bad(v) {
            edges[v as usize]
                .iter()
                .map(|&(t, _)| t)
                .filter(|&t| bad(t))
                .collect()
        } else {
            Vec::new()
        }
    });
    // Per component: the fair groups taken inside it, and those enabled in all its states.
    let count = component.iter().map(|&c| c + 1).max().unwrap_or(0) as usize;
    let mut inside = vec![0u32; count];
    let mut always = vec![u32::MAX; count];
    let mut has_edge = vec![false; count];
    for v in 0..states.len() as u32 {
        if !bad(v) {
            continue;
        }
        let c = component[v as usize] as usize;
        always[c] &= enabled[v as usize];
        for &(t, group) in &edges[v as usize] {
            if bad(t) && component[t as usize] as usize == c {
                has_edge[c] = true;
                if let Some(g) = group {
                    inside[c] |= 1 << g;
                }
            }
        }
    }
    // The first state (in BFS order, so on a shortest path) of a component the fair actors
    // cannot leave.
    let stuck = (0..states.len() as u32).find(|&v| {
        let c = component[v as usize] as usize;
        bad(v) && always[c] & !inside[c] == 0 && (has_edge[c] || always[c] == 0)
    })?;
    let c = component[stuck as usize];
    let cycle = if has_edge[c as usize] {
        cycle_within(stuck, |v| {
            edges[v as usize]
                .iter()
                .map(|&(t, _)| t)
                .filter(|&t| bad(t) && component[t as usize] == c)
                .collect()
        })
        .into_iter()
        .map(|(from, to)| action_between(model, states, from, to))
        .collect()
    } else {
        Vec::new()
    };
    Some(Counterexample {
        property: crate::EVERY_PEERPOD_RELEASED,
        path: path_to(parent, stuck),
        cycle,
        last: states[stuck as usize].clone(),
    })
}

/// Strongly connected components (iterative Tarjan): a component id per vertex.
fn tarjan(n: usize, successors: impl Fn(u32) -> Vec<u32>) -> Vec<u32> {
    const NONE: u32 = u32::MAX;
    let mut index = vec![NONE; n];
    let mut low = vec![0u32; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut component = vec![NONE; n];
    let mut next_index = 0u32;
    let mut next_component = 0u32;
    for root in 0..n as u32 {
        if index[root as usize] != NONE {
            continue;
        }
        let mut work: Vec<(u32, Vec<u32>, usize)> = vec![(root, successors(root), 0)];
        index[root as usize] = next_index;
        low[root as usize] = next_index;
        next_index += 1;
        stack.push(root);
        on_stack[root as usize] = true;
        while let Some((v, succ, i)) = work.last_mut() {
            let v = *v;
            if *i < succ.len() {
                let w = succ[*i];
                *i += 1;
                if index[w as usize] == NONE {
                    index[w as usize] = next_index;
                    low[w as usize] = next_index;
                    next_index += 1;
                    stack.push(w);
                    on_stack[w as usize] = true;
                    work.push((w, successors(w), 0));
                } else if on_stack[w as usize] {
                    low[v as usize] = low[v as usize].min(index[w as usize]);
                }
                continue;
            }
            work.pop();
            if let Some((u, _, _)) = work.last() {
                low[*u as usize] = low[*u as usize].min(low[v as usize]);
            }
            if low[v as usize] == index[v as usize] {
                while let Some(w) = stack.pop() {
                    on_stack[w as usize] = false;
                    component[w as usize] = next_component;
                    if w == v {
                        break;
                    }
                }
                next_component += 1;
            }
        }
    }
    component
}

/// A cycle from `start` back to it (as edges), by BFS within the component.
fn cycle_within(start: u32, successors: impl Fn(u32) -> Vec<u32>) -> Vec<(u32, u32)> {
    let mut came_from: HashMap<u32, u32> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in successors(v) {
            if w == start {
                let mut edges = vec![(v, w)];
                let mut at = v;
                while at != start {
                    let from = came_from[&at];
                    edges.push((from, at));
                    at = from;
                }
                edges.reverse();
                return edges;
            }
            if let std::collections::hash_map::Entry::Vacant(e) = came_from.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    Vec::new()
}

/// An action leading from `from` to `to` (recomputed: edges keep no actions).
fn action_between(model: &DeletionProtocol, states: &[State], from: u32, to: u32) -> Action {
    let mut actions = Vec::new();
    model.actions(&states[from as usize], &mut actions);
    actions
        .into_iter()
        .find(|&a| {
            model.next_state(&states[from as usize], a).as_ref() == Some(&states[to as usize])
        })
        .unwrap_or(Action::TimePasses)
}

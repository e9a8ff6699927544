//! `sandbox-bwrap-launch`: started by the bwrap plugin ahead of a create, it does the slow part
//! of a sandbox's start while nobody waits (joins the sandbox's cgroups, makes its user and
//! mount namespaces), then waits on stdin for the sandbox's [`LaunchCommand`], mounts the
//! overlay root and becomes bwrap inside the sandbox's user namespace. Not meant to be run by
//! hand.
//!
//! Usage: `sandbox-bwrap-launch --parent PID --id-map MAP [--cgroup-procs FILE]...`, or
//! `sandbox-bwrap-launch --remove-tree PATH --id-map MAP` to remove a tree a sandbox's ids
//! wrote, from a user namespace of the same map (see `userns::remove_tree_as_sandbox`), or
//! `sandbox-bwrap-launch --capture-layer PID UPPER INTO LIMIT --id-map MAP` to copy the
//! writable layer of the sandbox held by launcher PID into a snapshot's layer (see
//! the `layer-capture` crate; prints the bytes counted, exits 3 past LIMIT, 4 for a file
//! the snapshot store cannot hold).
//!
//! stdout is the agent's channel from the start, so nothing is ever written there. stderr is a
//! pipe into the sandbox's log, which the adapter keeps within a bound (what it shows in a
//! boot error); failures before the command arrives are kept until then (an unused launcher
//! writes nothing).

use std::fs::File;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitCode};

use nix::mount::{mount, MsFlags};
use nix::sys::signal::Signal;
use nix::unistd::{getppid, Pid};
use plugin_bwrap::fuse_disk;
use plugin_bwrap::launch::LaunchCommand;
use plugin_bwrap::netns::PastaStarter;
use plugin_bwrap::userns::{self, IdMap};

/// What `prepare` leaves for `launch`.
struct Prepared {
    map: IdMap,
    userns: OwnedFd,
    pasta: PastaStarter,
}

fn main() -> ExitCode {
    // In a worker's disk jail, as its `fusermount` (see `fuse_disk.rs`).
    if fuse_disk::is_fusermount_call() {
        return match fuse_disk::answer_fusermount() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(&format!("as fusermount: {e}")),
        };
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--remove-tree") {
        return remove_tree(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("--capture-layer") {
        return capture_layer(&args[1..]);
    }
    let setup = prepare(args);
    // SAFETY: fd 0 is this process's stdin, open for its whole life; ManuallyDrop keeps the
    // `File` from closing it, since bwrap inherits it as the agent's input.
    let stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
    let command = match LaunchCommand::read_from(&*stdin) {
        Ok(command) => command,
        // The adapter dropped this launcher without using it (shutdown, or a pool discarded):
        // nobody reads a log, and there is none to write to.
        Err(_) => return ExitCode::from(1),
    };
    let error = match setup.and_then(|prepared| launch(&command, prepared)) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    eprintln!("sandbox-bwrap-launch: {error}");
    ExitCode::from(1)
}

/// `--remove-tree PATH --id-map MAP`: removes PATH as the root of a namespace of MAP.
fn remove_tree(args: &[String]) -> ExitCode {
    let (path, map) = match args {
        [path, flag, map] if flag == "--id-map" => (Path::new(path), IdMap::parse_arg(map)),
        _ => return fail("usage: --remove-tree PATH --id-map MAP"),
    };
    let Some(map) = map else {
        return fail("--id-map: not UID:GID:COUNT[:SUBUID:SUBGID]");
    };
    let entered = userns::create(map).and_then(|userns| userns::enter(&userns, map));
    match entered.and_then(|()| sandbox_core::remove_tree::remove_tree(path)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("cannot remove {}: {e}", path.display())),
    }
}

/// `--capture-layer PID UPPER INTO LIMIT --id-map MAP`: UPPER is the sandbox's upper
/// directory as its launcher's mount namespace names it (reached through that process's
/// root, never by following a link); INTO an empty directory of the adapter's. An ordinary
/// user's copy runs as the root of a namespace of the sandbox's map, so the copy's files get
/// the same host owners; a root adapter's sees and sets the host ids themselves.
fn capture_layer(args: &[String]) -> ExitCode {
    let [pid, upper, into, limit, flag, map] = args else {
        return fail("usage: --capture-layer PID UPPER INTO LIMIT --id-map MAP");
    };
    let (Ok(pid), Ok(limit), Some(map)) = (
        pid.parse::<u32>(),
        limit.parse::<u64>(),
        IdMap::parse_arg(map).filter(|_| flag == "--id-map"),
    ) else {
        return fail("usage: --capture-layer PID UPPER INTO LIMIT --id-map MAP");
    };
    let become_owner = || {
        if map.needs_idmapped_mounts() {
            return Ok(());
        }
        userns::create(map).and_then(|userns| userns::enter(&userns, map))
    };
    ExitCode::from(layer_capture::copy_as_process(
        "sandbox-bwrap-launch",
        pid,
        Path::new(upper),
        Path::new(into),
        limit,
        become_owner,
    ))
}

fn fail(message: &str) -> ExitCode {
    eprintln!("sandbox-bwrap-launch: {message}");
    ExitCode::from(1)
}

/// Dies with the adapter, joins the cgroups, makes the sandbox's user namespace and a
/// private mount namespace (owned by the host's user namespace when the layers must be
/// idmapped first, else by the sandbox's).
fn prepare(args: Vec<String>) -> Result<Prepared, String> {
    let mut parent = None;
    let mut map = None;
    let mut cgroup_procs = Vec::new();
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--parent" => parent = value.parse::<i32>().ok().map(Pid::from_raw),
            "--id-map" => map = IdMap::parse_arg(&value),
            "--cgroup-procs" => cgroup_procs.push(value),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let map = map.ok_or("--id-map UID:GID:COUNT is required")?;
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| format!("cannot tie this process to the adapter: {e}"))?;
    // The adapter may have died between our fork and the line above: then nobody kills us.
    if parent.is_none_or(|parent| getppid() != parent) {
        return Err("the adapter that started this launcher is gone".into());
    }
    for procs in cgroup_procs {
        // Fails closed: outside its group the sandbox would run without the limits the
        // adapter writes there.
        std::fs::write(&procs, "0").map_err(|e| {
            format!("cannot join the sandbox's cgroup ({procs}), so its limits would not hold: {e}")
        })?;
    }
    // Before the sandbox's namespaces: pasta runs with the host's network and ids.
    let pasta = PastaStarter::fork().map_err(|e| format!("cannot fork pasta's starter: {e}"))?;
    let userns = userns::create(map).map_err(|e| e.to_string())?;
    if !map.needs_idmapped_mounts() {
        userns::enter(&userns, map).map_err(|e| e.to_string())?;
    }
    private_mount_namespace()?;
    Ok(Prepared { map, userns, pasta })
}

fn private_mount_namespace() -> Result<(), String> {
    idmap_mount::private_mount_namespace().map_err(|e| e.to_string())
}

/// Mounts the overlay root, enters the sandbox's user namespace and execs bwrap; returns
/// only on failure.
fn launch(command: &LaunchCommand, prepared: Prepared) -> Result<std::convert::Infallible, String> {
    let Prepared { map, userns, pasta } = prepared;
    let image_disk = command.disk.as_ref().filter(|d| d.image.is_some());
    let (command, args) = if map.needs_idmapped_mounts() {
        // An image is attached as host root, before the layer is cloned with it.
        if let Some(disk) = image_disk {
            disk.mount().map_err(|e| e.to_string())?;
        }
        let staged = stage(command, Some((&userns, map))).map_err(|e| e.to_string())?;
        userns::enter(&userns, map).map_err(|e| e.to_string())?;
        // A mount namespace of the sandbox's user namespace, where its root may mount the
        // overlay; the staged mounts come along, locked.
        private_mount_namespace()?;
        staged
    } else {
        if image_disk.is_some_and(|disk| disk.fuse.is_none()) {
            return Err("a layer image needs a root adapter, or FUSE".into());
        }
        (command.clone(), command.args.clone())
    };
    drop(userns);
    // A tmpfs, or an image served by FUSE, from the sandbox's own user namespace: their
    // files are the sandbox's.
    let own_disk = command
        .disk
        .as_ref()
        .filter(|d| d.image.is_none() || d.fuse.is_some());
    if let Some(disk) = own_disk {
        disk.mount()
            .map_err(|e| format!("cannot mount the sandbox's layer: {e}"))?;
    }
    let fuse = own_disk.and_then(|d| d.fuse.clone());
    // An ordinary user's sandbox: staged too, so that the overlay's options (which the
    // guest reads in its mountinfo) name the stage, not the adapter's home. After the disk,
    // which the layer's clone carries along. A FUSE disk is served at the paths it was
    // mounted with, so a worker VM's tree is left where it is and only the files bwrap binds
    // from the adapter's directories are staged.
    let (command, args) = if !map.needs_idmapped_mounts() && fuse.is_none() {
        stage(&command, None).map_err(|e| e.to_string())?
    } else if fuse.is_some() {
        let args = stage_files(&command, &args).map_err(|e| e.to_string())?;
        (command, args)
    } else {
        (command, args)
    };
    match fuse {
        // The kernel's overlayfs refuses an upper layer on FUSE (see `fuse_disk.rs`).
        Some(_) if !command.layers.is_empty() => {
            return Err("a worker VM's disk cannot stack snapshot layers".into())
        }
        Some(fuse) => {
            let disk = command
                .disk
                .as_ref()
                .map(|d| d.at.as_str())
                .unwrap_or_default();
            fuse.mount_overlay(
                Path::new(&command.lower),
                Path::new(disk),
                Path::new(&command.merged),
            )
            .map_err(|e| format!("cannot mount the sandbox's overlay root: {e}"))?;
        }
        None => {
            let options = command.overlay_options().map_err(|e| e.to_string())?;
            mount(
                Some("overlay"),
                command.merged.as_str(),
                Some("overlay"),
                MsFlags::empty(),
                Some(options.as_str()),
            )
            .map_err(|e| format!("cannot mount the sandbox's overlay root: {e}"))?;
        }
    }
    // The sandbox runs in a user namespace nested in this one (the same ids), so nothing set
    // here (the gate's rules, the limits of this namespace) is within its root's reach.
    let ids = map.ids_inside();
    command.ceilings.apply()?;
    if let Some(network) = &command.network {
        egress::gate::connect_gated(pasta, network, &command.log, ids)?;
    } else {
        drop(pasta);
        egress::gate::enter_nested(ids)?;
    }
    let _ = std::env::set_current_dir("/");
    let _ = std::io::stderr().flush();
    let error = Command::new(&command.bwrap).args(&args).env_clear().exec();
    Err(format!("cannot start {}: {error}", command.bwrap))
}

/// Where the launcher gathers what the sandbox sees: a tmpfs of its own private mount
/// namespace (the host's `/tmp` is untouched), which the sandbox's root may traverse where the
/// state directory's parents (`/root`, a 0700 temp dir) would stop it, and whose names are
/// all the guest's mountinfo shows of the host's layout.
const STAGE: &str = plugin_bwrap::launch::STAGE;

/// Shows the image root, the sandbox's layer and every bind source to the sandbox through
/// copies gathered under [`STAGE`], idmapped through `idmap`'s namespace when given (a root
/// adapter), else as they are; the agent (the program bwrap runs) is copied onto the stage,
/// since a bind's root in mountinfo is its source's path in its filesystem. Returns the
/// command and bwrap arguments to use instead.
fn stage(
    command: &LaunchCommand,
    idmap: Option<(&OwnedFd, IdMap)>,
) -> std::io::Result<(LaunchCommand, Vec<String>)> {
    let mut args = parse_args(&command.args);
    let clone = |path: &str| match idmap {
        Some((userns, _)) => idmap_mount::idmapped_clone(Path::new(path), userns),
        None => idmap_mount::plain_clone(Path::new(path)),
    };
    // Clones first: the stage covers /tmp, where the originals may live.
    let lower = clone(&command.lower)?;
    // Recursive: the layer's disk image is mounted in it.
    let layer = match idmap {
        Some((userns, _)) => idmap_mount::idmapped_clone_tree(Path::new(&command.layer), userns)?,
        None => idmap_mount::plain_clone_tree(Path::new(&command.layer))?,
    };
    // A snapshot's layer holds the sandbox's host ids already (it was copied from a layer the
    // sandbox's namespace wrote): shown as it is.
    let snapshot_layers = command
        .layers
        .iter()
        .map(|layer| idmap_mount::plain_clone(Path::new(layer)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let program = program_of(&args);
    let mut binds = Vec::new();
    for arg in &args {
        match arg {
            // Opened now, copied once the stage is up: it may live under /tmp.
            Arg::Bind { flag, source, dest }
                if flag == "--ro-bind" && program.as_ref() == Some(dest) =>
            {
                binds.push(Some(Staged::Copy(
                    open_file(source)?,
                    "sandbox-agent".into(),
                )))
            }
            // A file the adapter wrote in the layer (a networked sandbox's resolv.conf).
            Arg::Bind { flag, source, .. }
                if flag == "--ro-bind"
                    && Path::new(source).starts_with(&command.layer)
                    && std::fs::symlink_metadata(source)?.is_file() =>
            {
                let name = format!("file-{}", binds.len());
                binds.push(Some(Staged::Copy(open_file(source)?, name)))
            }
            // The merged root is the overlay, mounted inside the staged layer later; a
            // worker's `/state` in the layer's image is shown through the staged layer, whose
            // idmap makes it the sandbox's own (like `upper`).
            Arg::Bind { source, .. }
                if *source == command.merged || Path::new(source).starts_with(&command.layer) =>
            {
                binds.push(None)
            }
            Arg::Bind { flag, source, .. } => {
                let is_dir = std::fs::metadata(source)?.is_dir();
                // A writable bind (a worker's `/state`) belongs to the sandbox's ids on disk
                // already: shown as it is, so the guest's files stay in its range there.
                let tree = if flag == "--bind" {
                    idmap_mount::plain_clone(Path::new(source))?
                } else {
                    clone(source)?
                };
                binds.push(Some(Staged::Tree(tree, is_dir)));
            }
            Arg::Plain(_) => {}
        }
    }
    // An ordinary user's adapter names the sandbox's upper directory by its host path (a
    // snapshot's copy reads it through this namespace): where the stage covers that path, a
    // second copy of the layer is put back there, before anything else is placed, so that a
    // clash with a staged name fails instead of mixing the two.
    let layer_at_host = match idmap {
        None if Path::new(&command.layer).starts_with(STAGE) => {
            Some(idmap_mount::plain_clone_tree(Path::new(&command.layer))?)
        }
        _ => None,
    };
    let stage = idmap_mount::Stage::mount(Path::new(STAGE))?;
    if let Some(tree) = layer_at_host {
        std::fs::create_dir_all(&command.layer)?;
        idmap_mount::attach(&tree, Path::new(&command.layer))?;
    }
    let place = |tree: &OwnedFd, name: &str, is_dir: bool| -> std::io::Result<String> {
        Ok(stage.place(tree, name, is_dir)?.display().to_string())
    };
    let lower = place(&lower, "lower", true)?;
    let layer = place(&layer, "layer", true)?;
    let layers = snapshot_layers
        .iter()
        .enumerate()
        .map(|(index, tree)| place(tree, &format!("snapshot-{index}"), true))
        .collect::<std::io::Result<Vec<_>>>()?;
    let in_layer = |path: &str| -> std::io::Result<String> {
        let relative = Path::new(path)
            .strip_prefix(&command.layer)
            .map_err(|_| std::io::Error::other(format!("{path} is not in the sandbox's layer")))?;
        Ok(Path::new(&layer).join(relative).display().to_string())
    };
    let disk = match &command.disk {
        Some(disk) => Some(plugin_bwrap::disk::Disk {
            at: in_layer(&disk.at)?,
            ..disk.clone()
        }),
        None => None,
    };
    let staged = LaunchCommand {
        disk,
        upper: in_layer(&command.upper)?,
        work: in_layer(&command.work)?,
        merged: in_layer(&command.merged)?,
        lower,
        layers,
        layer: layer.clone(),
        ..command.clone()
    };
    let mut binds = binds.into_iter();
    let mut index = 0;
    for arg in &mut args {
        if let Arg::Bind { source, .. } = arg {
            *source = match binds.next().flatten() {
                Some(Staged::Tree(tree, is_dir)) => {
                    index += 1;
                    place(&tree, &format!("bind-{index}"), is_dir)?
                }
                Some(Staged::Copy(mut from, name)) => {
                    let at = Path::new(STAGE).join(name);
                    copy_read_only(&mut from, &at, idmap.map(|(_, map)| map))?;
                    at.display().to_string()
                }
                None => in_layer(source)?,
            };
        }
    }
    let args = render_args(args);
    Ok((staged, args))
}

/// The directory of a FUSE-disk worker VM's layer where its launcher mounts the tmpfs that
/// holds the copies of [`stage_files`].
const FILES_DIR: &str = "launch-files";

/// Copies the files bwrap binds from the adapter's own directories (the agent, a file the
/// adapter wrote in the layer such as resolv.conf) onto a tmpfs of this mount namespace and
/// binds the copies instead: a bind's root in mountinfo is its source's path in its
/// filesystem, and a tmpfs of its own shows only the copy's name. For a worker VM whose disk
/// FUSE serves at the paths it was mounted with (nothing else of it can move). The tmpfs is
/// mounted over a directory of the layer (the adapter's, never the guest's: its upper
/// directory is inside the FUSE disk), in this private namespace only.
fn stage_files(command: &LaunchCommand, args: &[String]) -> std::io::Result<Vec<String>> {
    let mut args = parse_args(args);
    let program = program_of(&args);
    let mut copies = Vec::new();
    for (index, arg) in args.iter().enumerate() {
        if let Arg::Bind { flag, source, dest } = arg {
            let adapters_file = flag == "--ro-bind"
                && (program.as_ref() == Some(dest)
                    || (Path::new(source).starts_with(&command.layer)
                        && std::fs::symlink_metadata(source)?.is_file()));
            if adapters_file {
                let name = if program.as_ref() == Some(dest) {
                    "sandbox-agent".to_string()
                } else {
                    format!("file-{}", copies.len())
                };
                copies.push((index, open_file(source)?, name));
            }
        }
    }
    if copies.is_empty() {
        return Ok(render_args(args));
    }
    let dir = Path::new(&command.layer).join(FILES_DIR);
    match std::fs::create_dir(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    if !std::fs::symlink_metadata(&dir)?.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    idmap_mount::Stage::mount(&dir)?;
    for (index, mut from, name) in copies {
        let at = dir.join(name);
        copy_read_only(&mut from, &at, None)?;
        if let Some(Arg::Bind { source, .. }) = args.get_mut(index) {
            *source = at.display().to_string();
        }
    }
    Ok(render_args(args))
}

/// The program bwrap runs (the agent): the first argument after `--`.
fn program_of(args: &[Arg]) -> Option<String> {
    match args
        .iter()
        .skip_while(|arg| !matches!(arg, Arg::Plain(a) if a == "--"))
        .nth(1)
    {
        Some(Arg::Plain(program)) => Some(program.clone()),
        _ => None,
    }
}

/// What one bind's source becomes on the stage.
enum Staged {
    /// A copy of the mount (a directory's when the flag is set, else a file's).
    Tree(OwnedFd, bool),
    /// A file copied onto the stage's tmpfs under this name: a bind's root in mountinfo is its
    /// source's path in its filesystem, which a copy on the stage keeps neutral.
    Copy(File, String),
}

/// A regular file of the adapter's, never through a link.
fn open_file(path: &str) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!("{path} is not a file")));
    }
    Ok(file)
}

/// Copies `from` to `at` on the stage with its modes but write; a root adapter's copy is owned
/// by the sandbox's root (no idmap shows it), an ordinary user's is already.
fn copy_read_only(from: &mut File, at: &Path, idmap: Option<IdMap>) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o700)
        .open(at)?;
    std::io::copy(from, &mut to)?;
    if let Some(map) = idmap {
        std::os::unix::fs::fchown(&to, Some(map.uid_base), Some(map.gid_base))?;
    }
    let mode = from.metadata()?.permissions().mode() & 0o555;
    to.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// bwrap's bind options: the only options of ours that name a host path.
const BINDS: [&str; 2] = ["--bind", "--ro-bind"];

/// One of bwrap's arguments: a bind of a host path, or anything else as it is.
enum Arg {
    Bind {
        flag: String,
        source: String,
        dest: String,
    },
    Plain(String),
}

/// Splits out the binds; everything after `--` is the agent's command line, left alone.
fn parse_args(args: &[String]) -> Vec<Arg> {
    let mut out = Vec::with_capacity(args.len());
    let mut rest = args.iter().cloned();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            out.push(Arg::Plain(arg));
            out.extend(rest.by_ref().map(Arg::Plain));
            break;
        }
        if !BINDS.contains(&arg.as_str()) {
            out.push(Arg::Plain(arg));
            continue;
        }
        match (rest.next(), rest.next()) {
            (Some(source), Some(dest)) => out.push(Arg::Bind {
                flag: arg,
                source,
                dest,
            }),
            // A truncated bind: bwrap itself will refuse it.
            (source, _) => out.extend(std::iter::once(arg).chain(source).map(Arg::Plain)),
        }
    }
    out
}

fn render_args(args: Vec<Arg>) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    for arg in args {
        match arg {
            Arg::Bind { flag, source, dest } => out.extend([flag, source, dest]),
            Arg::Plain(arg) => out.push(arg),
        }
    }
    out
}

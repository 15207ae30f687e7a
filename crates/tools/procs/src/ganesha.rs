//! nfs-ganesha, the NFS server the benchmarks compare iSCSI with: a configuration and a start
//! script for one export, run in a network namespace of the caller's choosing.
//!
//! ```text
//!   Setup::new(dir, export).write()?  ─►  script  ─► caller runs `bash script` in a namespace
//!   ready(): the server's log says it serves; stopped by SIGKILL of the PID spawned
//! ```
//!
//! Ganesha registers with rpcbind and will not serve without it, and rpcbind owns port 111 and
//! `/run/rpcbind.sock`: the script gives both a mount namespace of their own with a private
//! `/run`, so that servers in several network namespaces never meet, and a PID namespace, so
//! that both die with the script however it ends (rpcbind changes its user, which would clear a
//! parent-death signal). The PID spawned is `unshare`'s, which ignores SIGTERM: SIGKILL it
//! ([`crate::Guard`]'s drop does) and the script gets SIGTERM, stops ganesha cleanly and ends the
//! namespace. An ext4 image is loop-mounted inside that mount namespace, so the mount goes when
//! the server does; and the FUSE and loop mounts the namespace copied from its caller are let go
//! at once, or a client's FUSE export made before the server started would outlive its unmount.

use std::path::{Path, PathBuf};

/// What the server exports.
#[derive(Debug, Clone)]
pub enum Export {
    /// A directory as it is.
    Dir(PathBuf),
    /// A file holding an ext4 file system, loop-mounted for the server alone.
    Ext4Image(PathBuf),
}

/// The NFS port (NFSv3 and v4, TCP).
pub const NFS_PORT: u16 = 2049;
/// The MOUNT protocol's port.
pub const MOUNT_PORT: u16 = 20048;
/// The path clients mount.
pub const EXPORT_PATH: &str = "/export";
/// What ganesha logs once it serves.
const READY: &str = "NFS SERVER INITIALIZED";

/// One server: its directory (configuration, script, log, mount point) and its export.
#[derive(Debug, Clone)]
pub struct Setup {
    dir: PathBuf,
    export: Export,
}

impl Setup {
    pub fn new(dir: impl Into<PathBuf>, export: Export) -> Setup {
        Setup { dir: dir.into(), export }
    }

    /// Writes `ganesha.conf` and `run.sh` into the directory (made if missing); the script's
    /// path, to run as `bash SCRIPT` (root) inside the server's network namespace.
    pub fn write(&self) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let (path, mount) = match &self.export {
            Export::Dir(d) => (d.clone(), String::new()),
            Export::Ext4Image(img) => {
                let m = self.dir.join("export");
                std::fs::create_dir_all(&m)?;
                (m.clone(), format!("mount -o loop {} {}\n", quote(img), quote(&m)))
            }
        };
        std::fs::write(self.conf(), conf(&path))?;
        // A log left by an earlier server would read as ready at once.
        match std::fs::remove_file(self.log()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let script = self.dir.join("run.sh");
        std::fs::write(&script, script_text(&self.dir, &mount, &self.conf()))?;
        Ok(script)
    }

    fn conf(&self) -> PathBuf {
        self.dir.join("ganesha.conf")
    }

    /// The server's own log.
    pub fn log(&self) -> PathBuf {
        self.dir.join("ganesha.log")
    }

    /// True once the server's log says it serves.
    pub fn ready(&self) -> bool {
        std::fs::read_to_string(self.log()).is_ok_and(|l| l.contains(READY))
    }
}

/// Shell-quotes a path.
fn quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

/// One export, NFSv3 and v4 over TCP, root not squashed (the benchmarks run as root), and no
/// grace period: a fresh server has no clients to wait for. NLM, RQUOTA and UDP are off; no
/// client here uses them.
fn conf(export: &Path) -> String {
    format!(
        "NFS_CORE_PARAM {{\n    Protocols = 3, 4;\n    NFS_Port = {NFS_PORT};\n    MNT_Port = {MOUNT_PORT};\n    \
         Enable_NLM = false;\n    Enable_RQUOTA = false;\n    Enable_UDP = false;\n    Mount_Path_Pseudo = true;\n}}\n\
         NFSV4 {{ Graceless = true; }}\nNFS_KRB5 {{ Active_krb5 = false; }}\n\
         EXPORT {{\n    Export_Id = 1;\n    Path = \"{}\";\n    Pseudo = {EXPORT_PATH};\n    Access_Type = RW;\n    \
         Squash = No_Root_Squash;\n    Protocols = 3, 4;\n    Transports = TCP;\n    SecType = sys;\n    \
         FSAL {{ Name = VFS; }}\n}}\nLOG {{ Default_Log_Level = EVENT; }}\n",
        export.display()
    )
}

fn script_text(dir: &Path, mount: &str, conf: &Path) -> String {
    let log = dir.join("ganesha.log");
    format!(
        "#!/bin/bash\n\
         # nfs-ganesha with its own rpcbind, both in a mount namespace of their own (see stics-procs).\n\
         set -e\n\
         if [ -z \"$STICS_GANESHA_NS\" ]; then\n  \
           STICS_GANESHA_NS=1 exec unshare --mount --propagation private --pid --fork --kill-child=TERM bash \"$0\" \"$@\"\n\
         fi\n\
         # The new mount namespace began as a copy of the caller's: FUSE exports and loop-mounted\n\
         # file systems made before it would live on in it after their owners unmount them.\n\
         awk '$3 ~ /^fuse/ || $1 ~ /^\\/dev\\/loop/ {{print $2}}' /proc/self/mounts | sort -r | while read -r m; do\n  \
           umount -l \"$(printf '%b' \"$m\")\" 2>/dev/null || true\n\
         done\n\
         mount -t tmpfs tmpfs /run\n\
         mkdir -p /run/rpcbind /run/ganesha\n\
         {mount}\
         rm -f {log}\n\
         rpcbind -f &\n\
         rpcbind=$!\n\
         for _ in $(seq 100); do [ -S /run/rpcbind.sock ] && break; sleep 0.05; done\n\
         ganesha.nfsd -F -f {conf} -L {log} -p /run/ganesha/ganesha.pid -N NIV_EVENT &\n\
         ganesha=$!\n\
         trap 'kill -TERM $ganesha 2>/dev/null; wait $ganesha; kill $rpcbind 2>/dev/null; exit 0' TERM INT\n\
         status=0\n\
         wait $ganesha || status=$?\n\
         kill $rpcbind 2>/dev/null || true\n\
         exit $status\n",
        log = quote(&log),
        conf = quote(conf),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_loop_mounted_inside_the_server_s_namespace_and_exported() {
        let d = tempfile::tempdir().unwrap();
        let s = Setup::new(d.path().join("srv"), Export::Ext4Image(d.path().join("it's.img")));
        let script = std::fs::read_to_string(s.write().unwrap()).unwrap();
        let conf = std::fs::read_to_string(d.path().join("srv/ganesha.conf")).unwrap();
        let export = d.path().join("srv/export");
        assert!(conf.contains(&format!("Path = \"{}\";", export.display())), "{conf}");
        assert!(conf.contains("Pseudo = /export;") && conf.contains("NFS_Port = 2049;"));
        let unshare = script.find("exec unshare --mount").unwrap();
        let mount = script.find("mount -o loop").unwrap();
        let let_go = script.find("umount -l").unwrap();
        assert!(unshare < let_go && let_go < mount && mount < script.find("ganesha.nfsd").unwrap());
        assert!(script.contains(r"it'\''s.img"), "quoted: {script}");
        assert!(!s.ready());
        std::fs::write(s.log(), "... NFS SERVER INITIALIZED\n").unwrap();
        assert!(s.ready());
    }
}

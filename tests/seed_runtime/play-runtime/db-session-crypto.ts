// Stand-in for the runtime's `./db-session-crypto`, on `jose`. The envelope is
// the one sheetplane's gateway seals (sheetplane.crypto): a flattened JWE,
// RSA-OAEP-256 + A256GCM to the caller's public key (or A256KW + A256GCM under a
// harness unwrap key), with the session's identity as the JWE `aad`: canonical
// JSON of {expiresAt, logicalTable, operations (sorted), orgId, playName,
// tableNamespace}.
import {
  base64url,
  exportJWK,
  flattenedDecrypt,
  generateKeyPair,
  type KeyLike,
} from 'jose';
import type { CreateDbSessionResponse, EncryptedPostgresUrl } from './db-session';

export type PostgresUrlDecryptionKey = {
  request: {
    alg: 'RSA-OAEP-256+A256GCM';
    publicKeyJwk: JsonWebKey;
  };
  privateKey: KeyLike;
};

// One RSA key pair for the process, made on first use: the runtime asks for a
// key before every mint, and an RSA-2048 key costs tens to hundreds of
// milliseconds of CPU. Each envelope still has its own content key;
// sheetplane's own session manager also keeps one key for its lifetime.
let processKey: Promise<PostgresUrlDecryptionKey> | null = null;

async function makeDecryptionKey(): Promise<PostgresUrlDecryptionKey> {
  const { publicKey, privateKey } = await generateKeyPair('RSA-OAEP-256', {
    modulusLength: 2048,
  });
  const jwk = await exportJWK(publicKey);
  return {
    request: {
      alg: 'RSA-OAEP-256+A256GCM',
      publicKeyJwk: { kty: 'RSA', n: jwk.n, e: jwk.e, alg: 'RSA-OAEP-256', use: 'enc' },
    },
    privateKey,
  };
}

export function generateDbSessionPostgresUrlDecryptionKey(): Promise<PostgresUrlDecryptionKey> {
  processKey ??= makeDecryptionKey();
  return processKey;
}

export function dbSessionPostgresUrlAad(
  session: Omit<CreateDbSessionResponse, 'encryptedPostgresUrl'>,
): Uint8Array {
  const identity = {
    expiresAt: session.expiresAt,
    logicalTable: session.target.logicalTable,
    operations: [...session.operations].sort(),
    orgId: session.target.orgId,
    playName: session.playName,
    tableNamespace: session.target.tableNamespace,
  };
  return new TextEncoder().encode(JSON.stringify(identity));
}

async function open(
  encrypted: EncryptedPostgresUrl,
  key: KeyLike | Uint8Array,
  aad: Uint8Array,
  keyManagement: string,
): Promise<string> {
  if (encrypted.aad !== base64url.encode(aad)) {
    throw new Error('The encrypted Postgres URL belongs to another session.');
  }
  const { plaintext } = await flattenedDecrypt(
    {
      protected: encrypted.protected,
      encrypted_key: encrypted.encrypted_key,
      iv: encrypted.iv,
      ciphertext: encrypted.ciphertext,
      tag: encrypted.tag,
      aad: encrypted.aad,
    },
    key,
    {
      keyManagementAlgorithms: [keyManagement],
      contentEncryptionAlgorithms: ['A256GCM'],
    },
  );
  return new TextDecoder().decode(plaintext);
}

export async function decryptDbSessionPostgresUrlWithPrivateKey(input: {
  encrypted: EncryptedPostgresUrl;
  privateKey: KeyLike;
  aad: Uint8Array;
}): Promise<string> {
  return await open(input.encrypted, input.privateKey, input.aad, 'RSA-OAEP-256');
}

export async function decryptDbSessionPostgresUrl(input: {
  encrypted: EncryptedPostgresUrl;
  secret: string;
  aad: Uint8Array;
}): Promise<string> {
  // The harness unwrap key: 32 bytes, base64url.
  return await open(input.encrypted, base64url.decode(input.secret), input.aad, 'A256KW');
}
